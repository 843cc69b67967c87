"""Built-in datasets (offline built-ins, Hugging Face hub datasets, local files), registered
through the ``pflbench.datasets`` entry points exactly like third-party plugins."""

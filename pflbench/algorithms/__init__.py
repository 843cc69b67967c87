"""Built-in algorithms, one file each, registered through the ``pflbench.algorithms`` entry points
exactly like third-party plugins (see CONTRIBUTING.md)."""

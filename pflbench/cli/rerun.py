"""``pflbench rerun RUN_DIR``: reproduce a run from its config.json (``pflbench/runs/rerun.py``)."""

from __future__ import annotations

from typing import Any

import click

from pflbench.errors import ConfigError


@click.command("rerun")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Output folder of the rerun (it goes to OUT/runs/<name>/) [default: "
    "OUT/reruns/<name>-<time>/ beside the original's OUT/runs/]. Never the original's.",
)
@click.option(
    "--save-model/--no-save-model", default=None, help="Also write the final models [default: as the original run]."
)
@click.option("--log", multiple=True, help="Experiment tracker(s) for the rerun: tensorboard, mlflow.")
@click.option("--mlflow-uri", default=None, help="MLflow tracking URI for --log mlflow.")
@click.option(
    "--ray-address",
    default=None,
    help="Ray cluster (auto or HOST:PORT) for a run made with --executor ray [default: a local Ray "
    "instance; the address RUN_DIR records is never joined].",
)
@click.option(
    "--plugin",
    multiple=True,
    help="Plugin file the run used (repeatable): a run folder's own plugin files are imported only with --trust-plugins.",
)
@click.option(
    "--trust-plugins",
    is_flag=True,
    help="Load the plugin files the run recorded: the original file when its content still has the "
    "recorded sha256, else the run folder's copy (RUN_DIR/plugins/). This runs code named in RUN_DIR: "
    "only for run folders you trust.",
)
@click.option("--check", is_flag=True, help="Exit with code 1 if the rerun's metrics differ from the original's.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def rerun_command(
    run_dir: str,
    out: str | None,
    save_model: bool | None,
    log: tuple[str, ...],
    mlflow_uri: str | None,
    ray_address: str | None,
    plugin: tuple[str, ...],
    trust_plugins: bool,
    check: bool,
    quiet: bool,
) -> int:
    """Run RUN_DIR's experiment again from its config.json (every resolved setting and the
    algorithm's hyperparameters) into a new folder, then compare the metrics with the original's
    rounds.jsonl (timings aside; identical on the CPU), and say whether the code differs from
    what made the run. Nothing in RUN_DIR is executed or contacted unasked: a run that used plugin
    code needs --plugin FILE or --trust-plugins; trackers log only where --log says, and a Ray
    cluster is joined only at --ray-address."""
    from pflbench.cli.run import _execute_with_progress, _summary_line
    from pflbench.config.identity import identity_hash, identity_settings
    from pflbench.config.provenance import code_changes, code_record
    from pflbench.runs.execute import execute
    from pflbench.runs.rerun import compare_rounds, prepare_rerun

    if mlflow_uri is not None and "mlflow" not in {n.strip() for item in log for n in item.split(",")}:
        raise ConfigError(f"--mlflow-uri {mlflow_uri} would be ignored: nothing logs to MLflow without --log mlflow")
    overrides: dict[str, Any] = {}
    if save_model is not None:
        overrides["save_model"] = save_model
    if log:
        overrides["log"] = log
    if mlflow_uri is not None:
        overrides["mlflow_uri"] = mlflow_uri
    if ray_address is not None:
        overrides["ray_address"] = ray_address
    prepared, recorded = prepare_rerun(run_dir, out, overrides, plugin, trust_plugins)
    if recorded.config.ray_address and ray_address is None and recorded.config.executor == "ray":
        click.echo(
            f"ray: the run joined the Ray cluster {recorded.config.ray_address}; this rerun uses a local "
            "Ray instance (--ray-address ADDRESS joins a cluster you name)"
        )
    for note in recorded.plugin_notes:
        click.echo(note)
    plugins = recorded.loaded_plugins
    changes = code_changes(recorded.code, code_record(prepared.config, []))
    if recorded.code is None:
        click.echo(f"code: unknown ({changes[0]}); cannot tell whether it differs")
    elif changes:
        click.echo(f"code DIFFERS from what made the run: {'; '.join(changes)}", err=True)
    else:
        click.echo(f"code identical to what made the run (code identity {recorded.code.get('identity')})")
    identity = identity_hash(identity_settings(prepared.config, type(prepared.algorithm), prepared.algorithm.hparams))
    if recorded.identity_hash and identity != recorded.identity_hash:
        click.echo(
            f"warning: the rerun's settings hash to {identity}, the original's to "
            f"{recorded.identity_hash} (pflbench changed what identifies a run?)",
            err=True,
        )
    if quiet:
        summary = execute(prepared, plugins=plugins)
    else:
        summary = _execute_with_progress(prepared, plugins, execute)
    click.echo(_summary_line(summary))
    differences = compare_rounds(recorded.run_dir, prepared.run_dir)
    if not differences:
        click.echo(f"metrics identical to {recorded.run_dir} (timings aside)")
        return 0
    shown = "; ".join(differences[:3]) + (f"; … ({len(differences)} in all)" if len(differences) > 3 else "")
    click.echo(f"metrics DIFFER from {recorded.run_dir}: {shown}", err=True)
    return 1 if check else 0

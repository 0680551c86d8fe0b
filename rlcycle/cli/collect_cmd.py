"""`rlcycle collect`: production event logs to trajectories.arrow."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlcycle import console


def register(app: typer.Typer) -> None:
    @app.command(
        "collect",
        help=(
            "Read production event logs into trajectories (one row per model sample, with its tool "
            "results, edit outcomes, follow-up and feedback joined).\n\n"
            "Reads files, directories, globs and - (stdin) as JSON lines (.gz too), Arrow, Parquet "
            "or OpenTelemetry GenAI spans (OTLP/JSON). Bad records go to OUT.quarantine.jsonl "
            "(or fail with --strict, exit 2).\n\n"
            "Examples:\n\n"
            "  rlcycle collect sample_data/events -o runs/demo/trajectories.arrow\n\n"
            "  rlcycle collect 'logs/2026-11-30T*.jsonl' --policy-version policy-b -o traj.arrow --json\n\n"
            "  cat events.jsonl | rlcycle collect - -o - | rlcycle inspect -"
        ),
    )
    def collect(
        events: list[str] = typer.Argument(..., help="Event logs: files, directories, globs, or - for stdin."),
        out: str = typer.Option(..., "-o", "--out", help="trajectories.arrow (.parquet by extension; - for an Arrow stream on stdout)."),
        policy_version: list[str] = typer.Option(None, "--policy-version", help="Keep only this policy version (repeatable)."),
        since: str = typer.Option(None, "--since", help="Keep episodes starting at or after this RFC 3339 time."),
        until: str = typer.Option(None, "--until", help="Keep episodes starting before this RFC 3339 time."),
        maturity: float = typer.Option(None, "--maturity", help="Seconds an episode with edit outcomes still due is held back (default 21600)."),
        as_of: str = typer.Option(None, "--as-of", help="'Now' for the maturity rule (RFC 3339; default: the clock)."),
        strict: bool = typer.Option(None, "--strict", help="Fail (exit 2) on the first bad record instead of quarantining it."),
        quarantine: str = typer.Option(None, "--quarantine", help="Where bad records go (default: OUT.quarantine.jsonl)."),
        no_redact: bool = typer.Option(False, "--no-redact", help="Do not redact secrets (for logs already scrubbed)."),
        config: Path = typer.Option(None, "--config", help="TOML config ([collect] table or top level)."),
        set_: list[str] = typer.Option(None, "--set", help="Override a config key: --set maturity_s=3600 (repeatable)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or summary on stderr."),
    ) -> None:
        from rlcycle import collect as stage
        from rlcycle.config import resolve, save_resolved

        cfg = resolve(
            stage.CollectConfig,
            config,
            set_,
            {
                "policy_versions": policy_version or None,
                "since": since,
                "until": until,
                "maturity_s": maturity,
                "as_of": as_of,
                "strict": strict,
                "redact": False if no_redact else None,
            },
            section="collect",
        )
        result = stage.run(cfg, events, out, quarantine=quarantine, quiet=quiet)
        if out != "-":
            save_resolved(cfg, f"{out}.config.json")
        if as_json:
            if out == "-":
                console.info(json.dumps(result.as_dict(), sort_keys=True))
            else:
                console.print_json(result.as_dict())
        if not quiet:
            console.info(format_summary(result))


def format_summary(r) -> str:
    mb = r.bytes_read / 1e6
    lines = [
        f"collect: {r.events_in + r.quarantined:,} records from {r.files} file(s) "
        f"({mb:,.1f} MB) in {r.seconds:.1f}s, {r.partitions} partition(s)",
        f"  trajectories   {r.samples_out:,} samples in {r.episodes_out:,} episodes -> {r.output}",
        f"  duplicates     {r.duplicates:,} events" + (f", {r.duplicate_samples} repeated sample ids" if r.duplicate_samples else ""),
        f"  held back      {r.held_back_episodes:,} episodes ({r.held_back_samples:,} samples): edit outcomes still due",
        f"  filtered out   {r.filtered_samples:,} samples (policy version / time window)",
        f"  quarantined    {r.quarantined:,}" + (f" -> {r.quarantine}" if r.quarantine else ""),
    ]
    for reason, n in r.quarantine_reasons.most_common(8):
        lines.append(f"    {n:>8,}  {reason}")
    if r.orphans:
        lines.append("  orphans        " + ", ".join(f"{k}={v:,}" for k, v in sorted(r.orphans.items()))
                     + " (their sample or episode is not in this input)")
    if r.redactions:
        lines.append("  redacted       " + ", ".join(f"{k}={v:,}" for k, v in sorted(r.redactions.items())))
    if r.per_policy_version:
        lines.append("  per policy version:")
        for version, c in sorted(r.per_policy_version.items()):
            lines.append(
                f"    {version}: {c['samples_out']:,} samples, {c['episodes_out']:,} episodes, "
                f"{c['held_back_samples']:,} held back, {c['filtered']:,} filtered, "
                f"{c['invalid_tool_calls']:,} invalid tool calls"
            )
    return "\n".join(lines)

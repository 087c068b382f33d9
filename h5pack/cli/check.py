"""``h5pack info`` and ``h5pack verify``: describe and check a pack."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from h5pack.cli.flags import format_bytes, progress_for, quiet_flag

__all__ = ["info", "verify"]


def _info_lines(info: Any) -> list[tuple[str, str]]:
    classes = ", ".join(f"{name} {count}" for name, count in info.classes[:12])
    if len(info.classes) > 12:
        classes += f", ... ({len(info.classes) - 12} more)"
    if info.unlabelled:
        classes = (classes + ", " if classes else "") + f"unlabelled {info.unlabelled}"
    shape = info.sample_shape
    sample = f"{shape[1]}x{shape[0]} (WxH)" if shape else "of original sizes (per-sample shapes)"
    if info.layout == "chunked":
        layout = (
            f"chunked, chunk {info.chunk_shape} = {format_bytes(info.chunk_bytes)} "
            f"uncompressed, {info.num_chunks} chunks, {info.samples_per_chunk:.1f} samples/chunk"
        )
    else:
        layout = "contiguous"
    plugins = ", ".join(info.plugins) if info.plugins else "none (plain HDF5 reads it)"
    skipped = str(len(info.skipped))
    if info.skipped:
        skipped += ": " + ", ".join(s.path for s in info.skipped[:5])
        skipped += ", ..." if len(info.skipped) > 5 else ""
    return [
        ("pack", f"{info.path} ({format_bytes(info.file_bytes)})"),
        ("format", f"h5pack format {info.format_version}, written by h5pack {info.tool_version}"),
        ("created", info.created_utc),
        ("samples", f"{info.num_samples} in {len(info.classes)} classes"),
        ("classes", classes or "none"),
        ("mode", f"{info.mode} ({info.storage} storage)"),
        ("images", f"{info.dtype} {info.images_shape}, samples {sample}, {info.channels} ch"),
        ("layout", layout),
        ("codec", info.codec),
        ("ratio", _ratio_text(info)),
        ("plugins", plugins),
        ("shuffled", {True: "yes", False: "no", None: "unknown"}[info.shuffled]),
        ("skipped", skipped),
    ]


def _ratio_text(info: Any) -> str:
    """Return the ratio line of ``info``; uncompressed, the shortfall is padding: say so."""
    text = (
        f"{info.compression_ratio:.2f} ({format_bytes(info.stored_bytes)} of samples in "
        f"{format_bytes(info.disk_bytes)}"
    )
    padding = info.disk_bytes - info.stored_bytes
    if not info.filter_ids and padding > 0:
        share = padding / max(1, info.file_bytes)
        text += f", of which {format_bytes(padding)} is padding, {share:.1%} of the file"
    return text + ")"


@click.command()
@click.argument("pack", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def info(pack: str, as_json: bool) -> None:
    """Describe the pack PACK: samples, classes, layout, codec, ratio."""
    from h5pack.check import PROBE_TIMEOUT_S, pack_info

    summary = pack_info(pack, timeout_s=PROBE_TIMEOUT_S)  # damaged metadata cannot hang it
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        return
    for key, value in _info_lines(summary):
        click.echo(f"{key:<9} {value}")


@click.command()
@click.argument("pack", type=click.Path(dir_okay=False))
@click.option(
    "--source",
    type=click.Path(file_okay=False),
    default=None,
    help="The image folder the pack was made from: every image must be in the pack.",
)
@click.option("--labels", "labels_csv", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="With --source: compare the content of N random samples [default: all].",
)
@quiet_flag
def verify(
    pack: str, source: str | None, labels_csv: str | None, sample: int | None, quiet: bool
) -> None:
    """Check PACK: metadata, every checksum, every sample decodes (exit 1 on a problem)."""
    from h5pack.check import PROBE_TIMEOUT_S, probe_pack, verify_pack
    from h5pack.core.format import load_meta

    probe_pack(pack, timeout_s=PROBE_TIMEOUT_S, strict=False)  # damaged metadata cannot hang it
    total = load_meta(pack, check_digests=False).num_samples
    with progress_for(quiet) as progress:
        progress.event(_Phase("verifying", total))
        report = verify_pack(
            pack, source=source, labels_csv=labels_csv, sample=sample, progress=progress.advance
        )
    for problem in report.problems:
        click.echo(str(problem))
    summary = f"{report.num_verified} of {report.num_samples} samples verified"
    if report.num_source is not None:
        summary += (
            f"; source: {report.num_source} files in the folder, {report.missing} missing "
            f"(in the pack, not in the folder), {report.extra} extra (in the folder, not in "
            f"the pack), {report.skipped} skipped at conversion, {report.mismatched} with "
            f"another label, {report.changed} changed of {report.num_compared} compared"
        )
    if report.ok:
        click.echo(f"ok: {summary}")
        return
    click.echo(f"FAILED: {len(report.problems)} problems; {summary}", err=True)
    sys.exit(1)


class _Phase:
    """A progress phase announced by a command itself (shaped like a ``ConvertEvent``)."""

    kind = "phase"

    def __init__(self, message: str, total: int) -> None:
        self.message = message
        self.total = total

"""``h5pack info`` and ``h5pack verify``: describe and check a pack or a pack set.

``info``'s label mixing is ``training.mixing``'s figure, which ``check/`` may not import.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from h5pack.cli.flags import (
    checked_mix,
    format_bytes,
    mix_flags,
    quiet_flag,
    storage_option_flag,
    store_of,
)
from h5pack.cli.progress import progress_for
from h5pack.core.fields import field_text

__all__ = ["info", "verify"]


def _classes_text(info: Any) -> str:
    classes = ", ".join(f"{name} {count}" for name, count in info.classes[:12])
    if len(info.classes) > 12:
        classes += f", ... ({len(info.classes) - 12} more)"
    if info.unlabelled:
        classes = (classes + ", " if classes else "") + f"unlabelled {info.unlabelled}"
    return classes or "none"


def _skipped_text(info: Any) -> str:
    skipped = str(len(info.skipped))
    if info.skipped:
        skipped += ": " + ", ".join(s.path for s in info.skipped[:5])
        skipped += ", ..." if len(info.skipped) > 5 else ""
    return skipped


def _common_lines(info: Any) -> list[tuple[str, str]]:
    """Return the lines a pack and a pack set share, from ``samples`` to ``skipped``."""
    shape = info.sample_shape
    sample = f"{shape[1]}x{shape[0]} (WxH)" if shape else "of original sizes (per-sample shapes)"
    if hasattr(info, "shards"):
        images = f"samples {sample}, {info.channels} ch"
        layout = info.layout
        if info.num_chunks:  # contiguous shards have no chunks to count
            layout += f", {info.num_chunks} chunks, {info.samples_per_chunk:.1f} samples/chunk"
    else:
        images = f"{info.dtype} {info.images_shape}, samples {sample}, {info.channels} ch"
        if info.layout == "chunked":
            layout = (
                f"chunked, chunk {info.chunk_shape} = {format_bytes(info.chunk_bytes)} "
                f"uncompressed, {_chunk_count(info)}"
            )
        else:
            layout = "contiguous"
    plugins = ", ".join(info.plugins) if info.plugins else "none (plain HDF5 reads it)"
    return [
        ("samples", f"{info.num_samples} in {len(info.classes)} classes"),
        ("classes", _classes_text(info)),
        ("fields", ", ".join(field_text(f) for f in info.fields)),
        ("mode", f"{info.mode} ({info.storage} storage)"),
        ("images", images),
        ("layout", layout),
        ("codec", info.codec),
        ("ratio", _ratio_text(info)),
        ("plugins", plugins),
        ("shuffled", {True: "yes", False: "no", None: "unknown"}[info.shuffled]),
        ("skipped", _skipped_text(info)),
    ]


def _chunk_count(info: Any) -> str:
    """Return how many chunks of how many samples (array chunks: rows, and the last's)."""
    rows = info.chunk_shape[0] if info.storage == "array" and info.chunk_shape else 0
    if not rows:  # a blob's chunks hold as many samples as fit: say the mean
        return f"{info.num_chunks} chunks, {info.samples_per_chunk:.1f} samples/chunk on average"
    last = info.num_samples - (info.num_chunks - 1) * rows
    text = f"{info.num_chunks} chunks of {rows} samples"
    return text + (f" (the last holds {last})" if 0 < last < rows else "")


def _info_lines(info: Any) -> list[tuple[str, str]]:
    """Return the lines of ``h5pack info`` for a pack (a ``PackInfo``)."""
    version = f"{info.format_version}.{info.format_minor}"
    lines = [
        ("pack", f"{info.path} ({format_bytes(info.file_bytes)})"),
        ("format", f"h5pack format {version}, written by h5pack {info.tool_version}"),
        ("created", info.created_utc),
    ]
    shard = info.shard  # a shard written by convert --shards
    if shard:
        text = f"{shard.get('index')} of {shard.get('num_shards')} (seed {shard.get('seed')})"
        lines.append(("shard", f"{text}; read the whole set through its directory or packset.json"))
    return lines + _common_lines(info)


def _ratio_text(info: Any) -> str:
    """Return the ratio line of ``info``; uncompressed, the shortfall is padding: say so."""
    text = (
        f"{info.compression_ratio:.2f} ({format_bytes(info.stored_bytes)} of samples in "
        f"{format_bytes(info.disk_bytes)}"
    )
    padding = info.disk_bytes - info.stored_bytes
    if info.codec == "none" and padding > 0:
        share = padding / max(1, info.disk_bytes)
        text += f", of which {format_bytes(padding)} is padding, {share:.1%} of the images"
        if info.layout == "contiguous" and info.skipped:  # no other padding there
            count = len(info.skipped)
            text += f": the room the {count} skipped file{'s' if count != 1 else ''} had reserved"
    return text + ")"


def _set_lines(info: Any) -> list[tuple[str, str]]:
    """Return the lines of ``h5pack info`` for a pack set (a ``PackSetInfo``)."""
    if info.has_manifest:
        kind = f"pack set of {info.num_shards} shards"
        made = f"pack set manifest 1, written by h5pack {info.tool_version}, seed {info.seed}"
    else:
        kind = f"list of {info.num_shards} packs"
        made = f"packs written by h5pack {info.tool_version}"
    head = [
        ("set", f"{info.path} ({kind}, {format_bytes(info.file_bytes)})"),
        ("format", made),
    ]
    if info.created_utc:
        head.append(("created", info.created_utc))
    return head + _common_lines(info)


def _shard_table(info: Any) -> list[str]:
    """Return the per-shard table of ``h5pack info SET``: path, samples, size, skipped."""
    width = max(len("path"), *(len(row.path) for row in info.shards))
    rows = [f"{'path':<{width}}  {'samples':>9}  {'size':>10}  {'skipped':>7}"]
    rows += [
        f"{row.path:<{width}}  {row.num_samples:>9}  {format_bytes(row.file_bytes):>10}  "
        f"{row.skipped:>7}"
        for row in info.shards
    ]
    return rows


def _mixing(meta: Any, chunk_map: Any, *, contiguous: bool = False) -> tuple[str, dict[str, Any]]:
    """Return the ``mixing`` line of ``h5pack info`` (do chunks mix labels?) and its JSON."""
    from h5pack.training.mixing import label_mixing

    report = label_mixing(meta, chunk_map, stratified=True)
    data: dict[str, Any] = {
        "mixes_labels": None if report.exempt else not report.chunks_unmixed,
        "figure": None if report.exempt else round(report.figure, 4),
        "window_needed": report.window_needed if report.chunks_unmixed else None,
    }
    figure = f"label mixing {report.figure:.2f} per chunk, a shuffled pack scores ~1"
    if report.exempt:
        text = "not measured (fewer than two labels)"
    elif not report.chunks_unmixed and contiguous:
        # no HDF5 chunks: the loader reads groups of samples, which it shuffles like chunks
        figure = figure.replace("per chunk", "per read group")
        text = f"yes: the loader's read groups mix labels (contiguous, no chunks; {figure})"
    elif not report.chunks_unmixed:
        text = f"yes: chunks mix labels ({figure})"
    else:
        needed = report.window_needed or 1
        text = (
            f"no: chunks do not mix labels ({figure}). make_loader warns, orders chunks "
            f"stratified by label and widens its default window to >= {needed} chunks "
            "(decompressed chunks per worker, within its memory cap); re-convert without "
            "--no-shuffle (the write-time shuffle) to train like a full shuffle"
        )
    data["summary"] = text
    return text, data


@click.command()
@click.argument("packs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@mix_flags
@storage_option_flag
def info(
    packs: tuple[str, ...],
    as_json: bool,
    weights: tuple[float, ...] | None,
    epoch_samples: int | None,
    storage_option: tuple[str, ...],
) -> None:
    """Describe PACKS: a pack, a pack set (its directory or packset.json) or several packs.

    Samples, classes, layout, codec, ratio and whether chunks mix labels; for a set, one
    row per shard. PACKS may be URLs (s3://bucket/pack.h5, s3://bucket/set/). With
    --weights, PACKS are the sources of a mix: each one's share of an epoch, passes per
    epoch and coverage.
    """
    mixed = checked_mix(packs, weights, epoch_samples)
    if mixed is not None:
        _mix_info(packs, mixed, epoch_samples, as_json)
        return
    from h5pack.check import PROBE_TIMEOUT_S, pack_info, packset_summary
    from h5pack.core.packset import is_packset
    from h5pack.read.packset import load_pack_meta

    source: str | list[str] = packs[0] if len(packs) == 1 else list(packs)
    store = store_of(source, storage_option)
    summary: Any
    if is_packset(source):
        summary, view = packset_summary(  # each local shard probed
            source, timeout_s=PROBE_TIMEOUT_S, store=store
        )
        meta, chunk_map = view.meta, view.chunk_map
        lines = _set_lines(summary)
    else:  # damaged metadata cannot hang it: probed in a child (a URL: its index's CRC32)
        summary = pack_info(packs[0], timeout_s=PROBE_TIMEOUT_S, store=store)
        meta, chunk_map = load_pack_meta(packs[0], store=store), None
        lines = _info_lines(summary)
    contiguous = getattr(summary, "layout", "") == "contiguous"
    mixing, mixing_data = _mixing(meta, chunk_map, contiguous=contiguous)
    if as_json:
        data = summary.to_dict()
        data["mixing"] = mixing_data
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for key, value in [*lines, ("mixing", mixing)]:
        click.echo(f"{key:<9} {value}")
    if is_packset(source):
        table = _shard_table(summary)
        click.echo(f"{'shards':<9} {table[0]}")
        for row in table[1:]:
            click.echo(f"{'':<9} {row}")


def _mix_info(
    packs: tuple[str, ...], weights: tuple[float, ...], epoch_samples: int | None, as_json: bool
) -> None:
    """``info --weights``: what every epoch of the mix takes of each source."""
    from h5pack.bench import mix_plan

    plan = mix_plan(list(packs), weights, epoch_samples=epoch_samples)
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
        return
    classes = plan.view.meta.classes
    click.echo(
        f"mix of {len(packs)} sources, {plan.epoch_samples} samples per epoch, "
        f"{len(classes)} classes joined by name: {', '.join(classes[:8])}"
        + (", ..." if len(classes) > 8 else "")
    )
    for line in plan.lines():
        click.echo(line)


@click.command()
@click.argument("packs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--source",
    type=click.Path(),
    default=None,
    help="The image folder (or .tar of one) the pack (set) was made from: every image must "
    "be in it (in exactly one shard of a set).",
)
@click.option("--labels", "labels_csv", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--annotations",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --source: the COCO instances JSON the pack's boxes, labels and masks came from.",
)
@click.option(
    "--masks",
    type=click.Path(file_okay=False),
    default=None,
    help="With --source: the folder of masks the pack's masks came from.",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="With --source: compare the content of N random samples (over the whole set) "
    "[default: all].",
)
@quiet_flag
@storage_option_flag
def verify(
    packs: tuple[str, ...],
    source: str | None,
    labels_csv: str | None,
    annotations: str | None,
    masks: str | None,
    sample: int | None,
    quiet: bool,
    storage_option: tuple[str, ...],
) -> None:
    """Check PACKS (a pack, a pack set or several packs): metadata, checksums, decoding.

    Every sample of every shard is checked; a set's manifest too (every shard present and
    unchanged, one class list, no image in two shards); with --source, every sample and
    field against the source. Exit 1 on a problem.
    """
    from h5pack.check import PROBE_TIMEOUT_S, probe_pack, verify_pack
    from h5pack.core.format import load_meta
    from h5pack.core.packset import is_packset, load_manifest
    from h5pack.write.sources import SampleSource, sample_source

    extra: dict[str, Any] = {"annotations": annotations, "masks": masks, "labels_csv": labels_csv}
    given: str | SampleSource | None = source
    if source is not None:
        given = sample_source(source, store=store_of(source, storage_option), **extra)
    elif annotations or masks:
        raise click.BadParameter("needs --source: the images they describe")

    pack: str | list[str] = packs[0] if len(packs) == 1 else list(packs)
    store = store_of(pack, storage_option)
    total: int | None = None
    if store.remote:
        timeout = None  # its compact index is checked by CRC32; no HDF5 walk to hang on
    elif is_packset(pack):
        if isinstance(pack, str):
            total = load_manifest(pack).num_samples
        timeout = PROBE_TIMEOUT_S  # each shard probed by verify_packset
    else:
        probe_pack(packs[0], timeout_s=PROBE_TIMEOUT_S, strict=False)  # cannot hang on damage
        total = load_meta(packs[0], check_digests=False).num_samples
        timeout = None
    with progress_for(quiet) as progress:
        progress.phase("verifying", total)
        report = verify_pack(
            pack,
            source=given,
            labels_csv=labels_csv,
            sample=sample,
            progress=progress.advance,
            timeout_s=timeout,
            store=store,
        )
    for problem in report.problems:
        click.echo(str(problem))
    summary = f"{report.num_verified} of {report.num_samples} samples verified"
    if report.num_shards:
        summary += f" in {report.num_shards} shards"
    where = "the set" if report.num_shards else "the pack"
    if report.num_source is not None:
        summary += (
            f"; source: {report.num_source} images in the source, {report.missing} missing "
            f"(in {where}, not in the source), {report.extra} extra (in the source, not in "
            f"{where}), {report.skipped} skipped at conversion, {report.mismatched} with "
            f"another label, {report.changed} changed of {report.num_compared} compared"
        )
    if report.ok:
        click.echo(f"ok: {summary}")
        return
    click.echo(f"FAILED: {len(report.problems)} problems; {summary}", err=True)
    sys.exit(1)

"""``h5pack merge``: write one pack from the shards of a pack set, or from a list of packs."""

from __future__ import annotations

import click

from h5pack.cli.flags import (
    format_bytes,
    quiet_flag,
    staging_flag,
    storage_option_flag,
    store_of,
)
from h5pack.cli.progress import progress_for

__all__ = ["merge"]


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--overwrite", is_flag=True, help="Replace TARGET if it exists.")
@click.option(
    "--virtual",
    is_flag=True,
    hidden=True,
    help="Retired (says what replaces it).",
)
@click.option(
    "--keep-order",
    is_flag=True,
    help="Keep fixed-size samples exactly in the packs' order [default: the samples of "
    "each pack's last, partial chunk go to the end, so that every other chunk is copied as "
    "stored, not recompressed].",
)
@staging_flag
@storage_option_flag
@quiet_flag
def merge(
    sources: tuple[str, ...],
    target: str,
    overwrite: bool,
    virtual: bool,
    keep_order: bool,
    quiet: bool,
    staging_dir: str | None,
    storage_option: tuple[str, ...],
) -> None:
    """Merge SOURCES (a pack set's directory or manifest, or packs) into the pack TARGET.

    Stored chunks are copied without decompressing them; the packs must agree in format,
    mode, storage, sample shape, chunks, codec and classes. SOURCES and TARGET may be URLs
    (s3://bucket/set/): sources are downloaded into --staging-dir, TARGET uploaded.
    """
    from h5pack.write.merge import merge_packs

    source: str | list[str] = sources[0] if len(sources) == 1 else list(sources)
    with progress_for(quiet) as progress:
        report = merge_packs(
            source,
            target,
            overwrite=overwrite,
            virtual=virtual,
            keep_order=keep_order,
            progress=progress.advance,
            on_event=progress.event,
            staging_dir=staging_dir,
            store=store_of([target, *sources], storage_option),
        )
    count = len(report.sources)
    how = f"{report.chunks_copied} chunks copied as stored"
    if report.chunks_rechunked:
        how += (
            f", {report.chunks_rechunked} re-chunked (packs whose sample counts are not a "
            "multiple of the chunk's shift the chunks after them)"
        )
    if report.moved_to_end:
        how += (
            f"; the {report.moved_to_end} samples of the packs' last, partial chunks moved "
            "to the end (--keep-order keeps the order, re-compressing more)"
        )
    if report.bytes_copied:
        how += f", {format_bytes(report.bytes_copied)} of contiguous images copied"
    click.echo(
        f"merged {report.num_samples} samples from {count} packs into {report.path} "
        f"({format_bytes(report.file_bytes)}) in {report.elapsed_s:.1f} s: {how}"
    )

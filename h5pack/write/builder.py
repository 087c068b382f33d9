"""Build one pack file: images in blocks of whole chunks (compressed in the pool), then metadata."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5pack._version import __version__
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.fields import (
    LEGACY_FIELDS,
    Field,
    LazyColumn,
    stored_fields,
)
from h5pack.core.format import SkippedFile
from h5pack.core.record import PackRecord, skipped_text, write_record
from h5pack.errors import H5PackError
from h5pack.write.arena import Arena
from h5pack.write.blocks import ArrayAssembler, BlobAssembler, Block
from h5pack.write.fitting import fitted_columns
from h5pack.write.images import ImagesWriter, copy_array_rows
from h5pack.write.options import ConvertOptions
from h5pack.write.pipeline import (
    InlineExecutor,
    Prepared,
    compress_block,
    ordered_map,
)
from h5pack.write.plan import StoragePlan
from h5pack.write.publish import TempFiles

MAX_COMPACT_ATTRIBUTES = 64  # root attributes kept in its (checksummed) object header


def create_file(path: Path) -> h5py.File:
    """Create (truncate) a pack's HDF5 file: libver ``v110`` (checksummed metadata)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_LATEST)
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_attr_phase_change(MAX_COMPACT_ATTRIBUTES, MAX_COMPACT_ATTRIBUTES - 8)
    fid = h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)
    return h5py.File(fid)


@dataclass(frozen=True, kw_only=True)
class SampleTable:
    """What a conversion knows of each sample before decoding it, in write order."""

    labels: np.ndarray
    classes: tuple[str, ...]
    paths: Sequence[str]
    source_index: np.ndarray
    fields: tuple[Field, ...] = LEGACY_FIELDS
    columns: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.paths)


class _Record:
    """Per-sample metadata gathered while writing, in pack order (``capacity`` is the most)."""

    def __init__(self, capacity: int) -> None:
        n = max(1, capacity)
        self.count = 0
        self.positions = np.zeros(n, dtype=np.int64)
        self.shapes = np.zeros((n, 3), dtype=np.int32)
        self.sources = np.zeros((n, 2), dtype=np.int32)  # (H, W) before a resize
        self.crcs = np.zeros(n, dtype=np.uint32)
        # XXH3 at memory speed in the parent (core.integrity; docs/decisions/0025)
        self.digests = np.zeros(n, dtype=np.uint64) if integrity.has_sample_digest() else None

    def add(self, item: Prepared) -> None:
        i = self.count
        self.positions[i] = item.pos
        self.shapes[i] = item.shape
        self.crcs[i] = item.crc
        self.sources[i] = item.source or item.shape[:2]
        if self.digests is not None:
            assert item.data is not None  # spans are resolved by the caller
            self.digests[i] = integrity.sample_digest(item.data)
        self.count += 1


class PackBuilder:
    """Write the images of a pack, then its metadata; owns the open temporary file."""

    def __init__(self, path: Path, plan: StoragePlan, *, allocate: int, temps: TempFiles) -> None:
        self.path = path
        self.plan = plan
        self.temps = temps
        self.record = _Record(allocate)
        try:
            self.handle = create_file(temps.add(path))
        except OSError as err:
            raise H5PackError(f"cannot create {path}: {err}") from err
        staging = None
        if plan.spec.chunks is None and plan.storage == "blob":
            staging = temps.add(path.with_name(path.name + ".blob"))
        self.images = ImagesWriter(
            self.handle, fmt.IMAGES, plan.spec, allocate=allocate, staging=staging
        )
        self.assembler: ArrayAssembler | BlobAssembler
        if plan.storage == "array":
            assert plan.spec.sample_shape is not None
            self.assembler = ArrayAssembler(plan.spec.sample_shape, plan.group_samples)
        else:
            self.assembler = BlobAssembler(plan.chunk_bytes, capacity=allocate)

    def _blocks(self, prepared: Iterable[Prepared]) -> Iterator[Block]:
        for item in prepared:
            self.record.add(item)
            assert item.data is not None  # spans are resolved by the caller
            yield from self.assembler.add(item.data)
        yield from self.assembler.finish()

    def write(
        self,
        prepared: Iterable[Prepared],
        executor: Any,
        max_in_flight: int,
        arena: Arena | None = None,
    ) -> None:
        """Write every prepared sample, compressing blocks through ``executor`` (and ``arena``)."""
        # Blocks can share buffers when each is written or copied before the next is made.
        self.assembler.reuse = (
            not self.plan.spec.compressed
            or arena is not None
            or isinstance(executor, InlineExecutor)
        )
        blocks = self._blocks(prepared)
        if not self.plan.spec.compressed:
            for block in blocks:
                self.images.write_block(block)
            return

        def tasks() -> Iterator[tuple[Any, ...]]:
            for block in blocks:
                spec = self.images.spec_for(block)
                if arena is not None and block.data.nbytes <= arena.slot_bytes:
                    slot = arena.acquire()
                    arena.put(slot, block.data)
                    yield spec, block.start, len(block.data), None, slot
                else:
                    yield spec, block.start, len(block.data), block.data, None

        stored_blocks = ordered_map(executor, compress_block, tasks(), max_in_flight=max_in_flight)
        for (_, start, rows, _, slot), chunks in stored_blocks:
            self.images.grow_to(start + rows)
            for offset, mask, payload in chunks:
                if isinstance(payload, tuple) and arena is not None and slot is not None:
                    with arena.view(slot, *payload) as stored:
                        self.images.write_chunk(offset, stored, mask)
                else:
                    self.images.write_chunk(offset, payload, mask)
            if arena is not None and slot is not None:
                arena.release(slot)

    def finish(
        self,
        table: SampleTable,
        options: ConvertOptions,
        skipped: Sequence[SkippedFile],
        *,
        shard: str | None = None,
        mapper: Any = None,
    ) -> Path:
        """Complete the images and write the metadata; return the finished file's path."""
        num = self.record.count
        self.images.finish()
        if self.images.needs_rebuild:
            self._rebuild(num)
        pos = self.record.positions[:num]
        shapes = self.record.shapes[:num]
        paths = [table.paths[p] for p in pos]
        fields = stored_fields(table.fields)
        columns = fitted_columns(
            fields,
            {f.name: f.take(table.columns[f.name], pos) for f in fields},
            shapes,
            self.record.sources[:num],
            paths,
            options.resize if options.size is not None else "stretch",
        )
        for column in columns.values():
            if isinstance(column, LazyColumn):
                column.mapper = mapper  # made in the pool
        texts = {
            fmt.OPTIONS_KEY: json.dumps(options.to_json(), sort_keys=True),
            fmt.SKIPPED_KEY: skipped_text(skipped),
            **({fmt.SHARD_KEY: shard} if shard is not None else {}),
        }
        arrays = {
            fmt.LABELS: table.labels[pos],
            fmt.SHAPES: shapes,
            fmt.CHECKSUMS: self.record.crcs[:num],
            fmt.SOURCE_INDEX: table.source_index[pos],
        }
        if self.record.digests is not None:
            arrays[fmt.SAMPLE_XXH3] = self.record.digests[:num]
        chunk_bytes = 0
        if isinstance(self.assembler, BlobAssembler):
            arrays[fmt.OFFSETS] = self.assembler.final_offsets()
            arrays[fmt.SIZES] = np.asarray(self.assembler.sizes, dtype=np.int64)
            chunks = self.images.spec.chunks
            chunk_bytes = int(chunks[0]) if chunks is not None else self.plan.chunk_bytes
        record = PackRecord(
            mode=self.plan.mode,
            storage=self.plan.storage,
            channels=options.channels,
            classes=tuple(table.classes),
            paths=paths,
            arrays=arrays,
            texts=texts,
            blob_chunk_bytes=chunk_bytes,
            tool_version=__version__,
            fields=table.fields,
            columns=columns,
        )
        write_record(self.handle, record)
        self.handle.close()
        return self.path

    def _rebuild(self, num: int) -> None:
        """Copy a contiguous array allocated for every file into a new file of ``num`` rows.

        NOTE [ Contiguous packs and skipped files ]: a contiguous dataset cannot be resized,
        and the sample count is known only once every file is decoded.
        """
        fresh_path = self.temps.add(self.path.with_name(self.path.name + ".rebuilt"))
        fresh = create_file(fresh_path)
        dataset = self.plan.spec.create(fresh, fmt.IMAGES, num)
        copy_array_rows(self.handle[fmt.IMAGES], dataset, num)
        self.handle.close()
        self.path.unlink()
        self.handle = fresh
        self.path = fresh_path

    def close(self) -> None:
        """Close the file (after an error)."""
        self.images.abort()
        if self.handle.id.valid:
            self.handle.close()

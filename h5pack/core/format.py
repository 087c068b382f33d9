"""The on-disk format of a pack (version 1.1): names, attributes, and opening a pack.

Writers and readers import every name of the format from here: the names and versions
(``core.names``), the metadata record (``core.packmeta``), opening a pack
(``core.opening``) and reading its metadata (``core.readmeta``).

Layout of a pack, version 1 (``[1.1]``: added in format 1.1, which readers of 1.0 ignore)::

    /                       attrs: FORMAT_MARKER_KEY = "h5pack", FORMAT_VERSION_KEY = 1,
                                   [1.1] FORMAT_MINOR_KEY = 1,
                                   mode ("raw" | "encoded"), storage ("array" | "blob"),
                                   num_samples, channels, tool_version, created_utc,
                                   options (JSON), skipped (JSON list of {path, reason}),
                                   chunk_bytes (blob storage: bytes per chunk, else 0),
                                   [1.1] pack_id (32 random hex digits, new at each
                                   conversion: which pack a reader holds),
                                   [1.1] metadata_crc32 (JSON {name: 8 hex digits}, below),
                                   [1.1, optional] shard (JSON, only in the shards of a
                                   pack set: which slice of which split the pack holds,
                                   ``core.packset.ShardIdentity``; readers that do not
                                   know it ignore it),
                                   [1.1, optional] virtual_sources (JSON list of {path,
                                   pack_id, file_bytes, num_samples, digest}, only in a
                                   virtual pack written by ``merge --virtual``: the source
                                   packs its virtual ``/images`` maps; covered by
                                   metadata_crc32; a reader checks every source before
                                   serving a sample)
                                   [1.1, optional] fields (JSON list of {name, kind[, dtype,
                                   shape]}: the sample's fields, ``core.fields``; covered
                                   by metadata_crc32; a pack without it holds ``image``,
                                   ``label`` and ``key``, the datasets below)
    /images                 storage "array": uint8 (N, H, W, C), contiguous or chunked
                            storage "blob":  uint8 (total_bytes,), chunked by bytes
    /offsets                storage "blob" only: int64 (N + 1,), sample i's slot is
                            [offsets[i], offsets[i + 1]); slots never straddle a chunk
                            boundary unless a sample is larger than a chunk (see
                            docs/ARCHITECTURE.md, "Aligned blobs")
    /sizes                  storage "blob" only: int64 (N,), bytes of sample i inside its slot
    /labels                 int64 (N,), -1 when unlabeled
    /classes                UTF-8 strings (K,); labels index into it
                            (1.0: variable-length; 1.1: fixed-length, NUL-padded)
    /paths                  bytes (N,): source path relative to the root, "/"-separated,
                            os.fsencode()d so names that are not UTF-8 round-trip
                            (1.0: variable-length uint8; 1.1: fixed-length strings,
                            NUL-padded, in gzip-compressed chunks)
    /shapes                 int32 (N, 3): decoded (H, W, C) of each sample
    /checksums              uint32 (N,): CRC32 of the stored (uncompressed) bytes of sample i
    /source_index           int64 (N,): position of sample i in the sorted scan order
    /sample_xxh3            [1.1] uint64 (N,): XXH3-64 of the stored (uncompressed) bytes of
                            sample i (written when the writer has the xxhash package)
/fields/NAME            [1.1, optional] every field besides image, label and key, as
                            ``core.fields`` stores its kind: (N, *shape) for a fixed-size
                            value; values back to back (total, *shape) with
                            /fields/NAME.offsets int64 (N + 1,) for a variable one; each
                            dataset's CRC32 in metadata_crc32

Text attributes are variable-length strings in 1.0 and fixed-length UTF-8 strings in 1.1;
readers accept both.

Integrity (format 1.1). HDF5 checksums its own metadata (``libver`` low bound ``v110``) and
the root attributes are kept compact, inside the root's checksummed object header. HDF5
checksums neither raw data nor the global heap, so a 1.1 pack stores no variable-length
data at all, and:

- ``metadata_crc32`` records a CRC32 of every dataset a reader trusts besides the images
  (labels, classes, paths, shapes, checksums, source_index, offsets, sizes, sample_xxh3)
  and of the text attributes ``options``, ``skipped`` and (when present) ``shard``. The
  bytes digested: numeric datasets as their elements in C order, little-endian, in the
  dtype listed above; string datasets as each element's bytes preceded by its length
  (uint32 little-endian); text attributes as their UTF-8 bytes. ``read_meta`` checks all
  but ``paths`` (read lazily, checked by ``read_paths``); ``h5pack verify`` checks all.
- ``sample_xxh3`` lets readers check every sample they serve at memory speed (readers
  without xxhash, and 1.0 packs, check ``checksums``).
- ``pack_id`` with the file's (device, inode, size, mtime) is a reader's
  ``PackIdentity``: a dataset refuses a file that is not the one it was created on.
"""

from h5pack.core.names import *  # noqa: F403
from h5pack.core.opening import *  # noqa: F403
from h5pack.core.packmeta import *  # noqa: F403
from h5pack.core.readmeta import *  # noqa: F403

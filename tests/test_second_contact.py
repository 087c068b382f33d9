"""What a new user tripped on (issue 20 E, G, 6-11): each case names the culprit."""

import fcntl
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from h5pack.cli.main import EXIT_INTERRUPTED, cli
from h5pack.core.layout import Compression
from h5pack.errors import FormatError, OptionsError, PackNotFoundError
from h5pack.training.dataset import H5ImageDataset
from h5pack.training.loader import make_loader
from h5pack.write.convert import convert, write_arrays
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import metadata_bytes
from tests.helpers import make_folder, make_pack


def _cli(*args: object):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_a_fifo_given_as_a_pack_is_refused_before_opening(tmp_path) -> None:  # E
    fifo = tmp_path / "pack.h5"
    os.mkfifo(fifo)
    message = r"pack\.h5 is not a regular file \(a FIFO, a socket or a device\)"
    with pytest.raises(FormatError, match=message):
        make_loader(fifo, 4, num_workers=0)  # hung for ever: HDF5 waits for a writer
    with pytest.raises(FormatError, match=message):
        H5ImageDataset(fifo)
    result = _cli("info", fifo)
    assert result.exit_code == 1
    assert "is not a regular file" in result.output


def test_a_target_with_a_trailing_slash_is_a_directory(tmp_path) -> None:  # 6
    images = tmp_path / "images"
    make_folder(images)
    result = _cli("convert", images, f"{tmp_path / 'out'}/", "--workers", "1")
    assert result.exit_code == 2
    assert "names a directory (the trailing slash)" in result.output
    assert "--shards N" in result.output
    assert not (tmp_path / "out").exists()  # was: a file named out


def test_an_image_folder_given_as_a_pack_says_convert_it_first(tmp_path) -> None:  # 7
    images = tmp_path / "images"
    make_folder(images)
    message = (
        r"images holds images, not a pack: convert it first \(h5pack convert .*images out\.h5\)"
    )
    with pytest.raises(PackNotFoundError, match=message):
        make_loader(images, 4, num_workers=0)
    with pytest.raises(PackNotFoundError, match=message):
        H5ImageDataset(images)
    for command in ("info", "verify"):
        result = _cli(command, images)
        assert result.exit_code == 1
        assert "holds images, not a pack: convert it first" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PackNotFoundError, match=r"has no packset\.json"):  # a set, interrupted
        make_loader(empty, 4, num_workers=0)


def test_a_labels_csv_that_leaves_images_out_says_how_many(tmp_path) -> None:  # 8
    images = tmp_path / "images"
    make_folder(images, per_class=3)  # 6 images
    csv = tmp_path / "labels.csv"
    csv.write_text("cat/000.jpg,0\ndog/001.jpg,1\n")
    result = _cli("convert", images, tmp_path / "out.h5", "--labels", csv, "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    assert "Warning: the labels CSV" in result.stderr
    assert "lists 2 of the 6 images under" in result.stderr
    assert "4 left out (cat/001.jpg, cat/002.jpg, dog/000.jpg, dog/002.jpg)" in result.stderr


def test_ctrl_c_exits_130(tmp_path, monkeypatch) -> None:  # 9
    import h5pack.write.convert

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(h5pack.write.convert, "convert", interrupted)
    images = tmp_path / "images"
    make_folder(images)
    result = _cli("convert", images, tmp_path / "out.h5")
    assert result.exit_code == EXIT_INTERRUPTED == 130
    assert "Aborted!" not in result.output


def test_convert_options_take_an_int_size_as_a_square() -> None:  # 10
    assert ConvertOptions(size=256).size == (256, 256)  # type: ignore[arg-type]
    assert ConvertOptions(size=[3, 4]).size == (3, 4)  # type: ignore[arg-type]
    for bad in ("256", 2.5, (1, 2, 3), 0, True):
        with pytest.raises(OptionsError, match=r"--size \(size=\) should be two positive"):
            ConvertOptions(size=bad)  # type: ignore[arg-type]


def test_a_locked_file_says_what_a_cli_user_can_do(tmp_path) -> None:  # 11
    pack = make_pack(tmp_path / "out.h5")
    temp = tmp_path / ".out2.h5.4242.tmp"  # write.publish.temp_path's shape
    shutil.copy(pack, temp)
    with temp.open("rb") as held_temp, pack.open("rb") as held:
        fcntl.flock(held_temp, fcntl.LOCK_EX)
        fcntl.flock(held, fcntl.LOCK_EX)
        result = _cli("info", temp)
        assert result.exit_code == 1
        assert "hidden temporary file of a conversion still running (process 4242)" in result.output
        assert f"appears as {tmp_path / 'out2.h5'} when it is complete" in result.output
        assert "locking=False" not in result.output
        result = _cli("info", pack)
        assert result.exit_code == 1
        assert "HDF5_USE_FILE_LOCKING=FALSE in the environment" in result.output
        # HDF5 reads the variable once, when the library starts: in a fresh process
        env = {**os.environ, "HDF5_USE_FILE_LOCKING": "FALSE"}
        command = [sys.executable, "-m", "h5pack", "info", str(pack)]
        assert subprocess.run(command, env=env, capture_output=True).returncode == 0


def _damaged(tmp_path):
    base = np.linspace(0, 255, 16 * 16 * 3).reshape(16, 16, 3).astype(np.uint8)
    images = [np.roll(base, i, axis=1) for i in range(16)]
    path = tmp_path / "damaged.h5"
    options = ConvertOptions(chunk_samples=8, compression=Compression(codec="gzip"))
    write_arrays(path, images, [i % 2 for i in range(16)], options=options)
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(1)
    with open(path, "r+b") as f:
        for k in range(8, min(info.size, 400), 16):
            f.seek(info.byte_offset + k)
            byte = f.read(1)[0]
            f.seek(info.byte_offset + k)
            f.write(bytes([byte ^ 0xFF]))
    return path


def test_damage_found_in_a_worker_arrives_as_the_original_error(tmp_path) -> None:  # G
    path = _damaged(tmp_path)
    with make_loader(path, 4, num_workers=0) as loader, pytest.raises(FormatError) as direct:
        list(loader)
    loader = make_loader(path, 4, num_workers=1, output="hwc", persistent_workers=False)
    with pytest.raises(FormatError) as caught:
        list(loader)
    text = str(caught.value)
    assert text == str(direct.value)  # first and whole: no worker traceback around it
    assert "chunk group 1" in text
    assert "Traceback" not in text
    assert caught.value.__cause__ is None


def test_verify_of_a_pack_replaced_mid_run_says_run_verify_again(tmp_path, monkeypatch) -> None:
    import h5pack.check.verify as verify

    pack = make_pack(tmp_path / "p.h5")
    other = make_pack(tmp_path / "q.h5")  # another pack id
    structure = verify._structure_problems

    def replaced_meanwhile(*args: object, **kwargs: object):  # between metadata and images
        os.replace(other, pack)
        return structure(*args, **kwargs)

    monkeypatch.setattr(verify, "_structure_problems", replaced_meanwhile)
    result = _cli("verify", pack, "-q")
    assert result.exit_code == 1
    assert "was replaced while verify read it" in result.output
    assert "run verify again" in result.output
    assert "loader" not in result.output  # was: "rebuild the loader"


def test_the_room_asked_for_is_never_more_than_the_samples(tmp_path, monkeypatch) -> None:  # H
    import h5pack.write.publish as publish

    asked: list[int] = []
    reserve = publish.reserve_room

    def recorded(path, nbytes, *, what):
        asked.append(nbytes)
        return reserve(path, nbytes, what=what)

    monkeypatch.setattr(publish, "reserve_room", recorded)
    make_folder(tmp_path / "images", per_class=20, size=(32, 32))  # 40 images, one chunk
    options = ConvertOptions(size=(32, 32), compression=Compression(codec="zstd"), workers=2)
    convert(tmp_path / "images", tmp_path / "p.h5", options)
    pixels = 40 * 32 * 32 * 3  # 120 KiB; compressed, the pack is smaller
    assert asked
    # was: room for every block the 2 workers could hold, 3 x 120 KiB
    metadata = metadata_bytes(40, 40 * 32, blob=False)  # its own room, on top
    assert max(asked) <= pixels + pixels // 64 + 2**15 + metadata


def test_info_says_what_it_measures(tmp_path) -> None:  # 13
    images = tmp_path / "images"
    make_folder(images, per_class=3)  # 6 images of 12x16
    (images / "cat" / "broken.jpg").write_bytes((images / "cat" / "000.jpg").read_bytes()[:200])
    blob = tmp_path / "blob.h5"
    assert _cli("convert", images, blob, "--mode", "encoded", "--workers", "1", "-q").exit_code == 0
    text = _cli("info", blob).output
    assert "h5pack format 1.1," in text  # was: "format 1"
    assert "of the images: the room the 1 skipped file had reserved" in text
    assert "read groups mix labels (contiguous, no chunks" in text  # was: "chunks mix labels"

    (images / "cat" / "broken.jpg").unlink()
    rows = tmp_path / "rows.h5"
    assert (
        _cli("convert", images, rows, "--chunk-samples", "4", "--workers", "1", "-q").exit_code == 0
    )
    assert "2 chunks of 4 samples (the last holds 2)" in _cli("info", rows).output  # was: 3.0


@pytest.mark.parametrize("num_workers", [0, 1])
def test_contiguous_batches_on_request(tmp_path, num_workers) -> None:  # 14
    import torch

    pack = make_pack(tmp_path / "p.h5")
    default = next(iter(make_loader(pack, 4, num_workers=num_workers, shuffle=False)))[0]
    assert not default.is_contiguous()  # channels-last views, no copy: the default
    assert default.is_contiguous(memory_format=torch.channels_last)
    loader = make_loader(
        pack, 4, num_workers=num_workers, shuffle=False, memory_format=torch.contiguous_format
    )
    flat = next(iter(loader))[0]
    assert flat.is_contiguous()
    assert flat.view(4, -1).shape == (4, 6 * 5 * 3)
    assert torch.equal(flat, default)
    with pytest.raises(OptionsError, match=r"memory_format should be torch\.channels_last"):
        make_loader(pack, 4, memory_format=torch.preserve_format)


def test_flags_read_as_one_family(tmp_path) -> None:  # 16
    from h5pack.core import format as fmt

    result = _cli("--help")
    for summary in ("what happened.", "or several packs.", "the pack TARGET."):
        assert summary in " ".join(result.output.split())  # was cut mid-sentence: "..."
    images = tmp_path / "images"
    make_folder(images)
    for size, shape in (("6", (6, 6)), ("6,8", (6, 8))):
        target = tmp_path / f"{size}.h5"
        assert (
            _cli("convert", images, target, "--size", size, "--workers", "1", "-q").exit_code == 0
        )
        assert fmt.load_meta(target).images_shape[1:3] == shape  # as --train-size N|H,W
    old = tmp_path / "old.h5"  # the first spelling, two values, still works
    assert _cli("convert", images, old, "--size", "6", "8", "--workers", "1", "-q").exit_code == 0
    assert fmt.load_meta(old).images_shape[1:3] == (6, 8)
    help_text = _cli("convert", "--help").output
    assert "--shuffle-filter" in help_text  # the filter; --no-shuffle is the write order
    assert "--shuffle [" not in help_text  # its old spelling is a hidden alias
    args = ("--compression", "zstd", "--workers", "1", "-q")
    for flag in ("--shuffle-filter", "--shuffle"):
        target = tmp_path / f"{flag}.h5"
        assert _cli("convert", images, target, *args, flag, "bit").exit_code == 0
        assert fmt.load_meta(target).options["compression"]["shuffle"] == "bit"

"""Site folders read as they are, or refused naming the path and the node (issue 47, common/data/site_reader.py).

Each case was once read silently wrong: a symlink loop trained a site on 984 images instead of 24, a 16-bit
PNG became all white, a 20000x20000 PNG raised a bare DecompressionBombError, and a NaN label was reported as
"label 0.0 is outside the label space" against a valid row.
"""

from __future__ import annotations

import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from common.run.config import parse_run_config
from common.data.site_data import load_site_data, site_spec
from common.data.site_reader import SiteDataError, eight_bit
from server_app.registry import SERVER_STRATEGIES
from tests.site_folders import CLASS_NAMES, site_run_config


def _cfg(**extra):
    return parse_run_config(site_run_config(**extra), SERVER_STRATEGIES)


def _load(tmp_path: Path, folder: Path, **extra):
    return load_site_data(site_spec(_cfg(**extra), str(folder)), "site-x", str(tmp_path / "cache"))


def _refusal(tmp_path: Path, folder: Path, **extra) -> str:
    with pytest.raises(SiteDataError) as caught:
        _load(tmp_path, folder, **extra)
    message = str(caught.value)
    assert message.startswith("node 'site-x': "), message
    return message


def _grey_site(root: Path, per_class: int = 4, classes=(0, 1)) -> Path:
    """root/train/<class>/<i>.png: 28x28 grey images, a different constant value per image."""
    for label in classes:
        folder = root / "train" / CLASS_NAMES[label]
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(np.full((28, 28), 20 * i + label, np.uint8)).save(folder / f"{i}.png")
    return root


# ----- symlinks -----------------------------------------------------------------------------------------

def test_a_symlink_loop_in_a_class_folder_is_refused_naming_it(tmp_path):
    site = _grey_site(tmp_path / "site")
    (site / "train" / "tshirt" / "again").symlink_to(site / "train", target_is_directory=True)
    message = _refusal(tmp_path, site)
    assert f"{site / 'train' / 'tshirt' / 'again'} is a symlink loop" in message, message


def test_a_symlink_out_of_the_site_folder_is_refused_naming_it(tmp_path):
    site = _grey_site(tmp_path / "site")
    elsewhere = _grey_site(tmp_path / "elsewhere")
    (site / "train" / "tshirt" / "borrowed.png").symlink_to(elsewhere / "train" / "tshirt" / "0.png")
    message = _refusal(tmp_path, site)
    assert f"{site / 'train' / 'tshirt' / 'borrowed.png'} is a symlink to" in message
    assert "outside the site folder" in message, message
    (site / "train" / "tshirt" / "borrowed.png").unlink()
    (site / "train" / "trouser" / "more").symlink_to(elsewhere / "train" / "trouser", target_is_directory=True)
    assert "outside the site folder" in _refusal(tmp_path, site)


def test_a_symlink_into_another_class_folder_is_refused(tmp_path):
    site = _grey_site(tmp_path / "site")
    (site / "train" / "tshirt" / "trousers").symlink_to(site / "train" / "trouser", target_is_directory=True)
    assert "outside its class folder" in _refusal(tmp_path, site)


def test_links_inside_the_site_folder_and_a_linked_site_folder_are_read(tmp_path):
    site = _grey_site(tmp_path / "site")
    (site / "pool").mkdir()
    Image.fromarray(np.full((28, 28), 200, np.uint8)).save(site / "pool" / "extra.png")
    (site / "train" / "tshirt" / "extra.png").symlink_to(site / "pool" / "extra.png")
    (tmp_path / "link").symlink_to(site, target_is_directory=True)  # the dataset-path itself a link (simulation)
    data = _load(tmp_path, tmp_path / "link", **{"local-test-fraction": 0.0})
    assert len(data.y_train) == 9 and 200 in data.x_train[:, 0, 0, 0]


# ----- pixel values on their real range -------------------------------------------------------------------

def test_a_16_bit_png_keeps_its_values_within_rounding(tmp_path):
    folder = tmp_path / "site" / "train" / "tshirt"
    folder.mkdir(parents=True)
    values = (np.arange(28 * 28).reshape(28, 28) * 83).astype(np.uint16)  # 0..65,000
    Image.fromarray(values).save(folder / "deep.png")
    assert Image.open(folder / "deep.png").mode == "I;16"
    data = _load(tmp_path, tmp_path / "site", **{"local-test-fraction": 0.0})
    expected = values.astype(np.float64) / 257.0
    assert np.abs(data.x_train[0, :, :, 0] - expected).max() <= 0.5  # before: 255 wherever a value was > 255
    assert data.x_train.max() > 250 and data.x_train.min() == 0


def test_a_palette_image_is_read_through_its_palette(tmp_path):
    folder = tmp_path / "site" / "train" / "tshirt"
    folder.mkdir(parents=True)
    indices = (np.arange(28 * 28).reshape(28, 28) % 3).astype(np.uint8)
    image = Image.fromarray(indices, mode="P")
    image.putpalette([10, 10, 10, 128, 128, 128, 250, 250, 250] + [0] * (256 * 3 - 9))
    image.save(folder / "palette.png")
    data = _load(tmp_path, tmp_path / "site", **{"local-test-fraction": 0.0})
    np.testing.assert_array_equal(data.x_train[0, :, :, 0], np.array([10, 128, 250], np.uint8)[indices])


def test_arrays_are_brought_to_eight_bits_on_their_real_range():
    assert eight_bit(np.array([0, 257, 65535], np.uint16)).tolist() == [0, 1, 255]
    assert eight_bit(np.array([0.0, 0.5, 1.0])).tolist() == [0, 128, 255]
    assert eight_bit(np.array([0, 17, 255], np.int64)).tolist() == [0, 17, 255]
    with pytest.raises(ValueError, match="outside 0..255"):
        eight_bit(np.array([-1, 300], np.int64))


# ----- images that must not be decoded ----------------------------------------------------------------

def _png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming width x height grey pixels, with one tiny compressed row: a decompression bomb's header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * (width + 1)))
            + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_refused_naming_the_file_and_the_node(tmp_path):
    site = _grey_site(tmp_path / "site")
    (site / "train" / "tshirt" / "huge.png").write_bytes(_png_header_only(20000, 20000))
    started = time.monotonic()
    message = _refusal(tmp_path, site)
    assert time.monotonic() - started < 20
    assert str(site / "train" / "tshirt" / "huge.png") in message and "decompression bomb" in message, message


def test_an_undecodable_image_is_refused_naming_the_file_and_the_node(tmp_path):
    site = _grey_site(tmp_path / "site")
    (site / "train" / "trouser" / "cut.png").write_bytes(_png_header_only(28, 28)[:40])
    message = _refusal(tmp_path, site)
    assert str(site / "train" / "trouser" / "cut.png") in message and "cannot be decoded" in message, message


# ----- labels reported with their row and value ------------------------------------------------------------

def _parquet(folder: Path, labels: list) -> Path:
    import pandas as pd

    folder.mkdir(parents=True)
    images = []
    for i in range(len(labels)):
        buffer = io.BytesIO()
        Image.fromarray(np.full((28, 28), i, np.uint8)).save(buffer, format="PNG")
        images.append(buffer.getvalue())
    pd.DataFrame({"image": images, "label": labels}).to_parquet(folder / "train.parquet")
    return folder


def test_a_nan_label_is_reported_with_its_row_and_value(tmp_path):
    folder = _parquet(tmp_path / "site", [0.0, 1.0, float("nan"), 2.0])
    message = _refusal(tmp_path, folder)
    assert "row 2 of" in message and "train.parquet" in message and "has no label" in message, message  # before: "label 0.0" of row 0


def test_whole_float_labels_are_read_and_a_fraction_is_reported_with_its_row(tmp_path):
    data = _load(tmp_path, _parquet(tmp_path / "whole", [0.0, 1.0, 2.0, 3.0]), **{"local-test-fraction": 0.0})
    assert sorted(data.y_train.tolist()) == [0, 1, 2, 3]
    message = _refusal(tmp_path, _parquet(tmp_path / "fraction", [0.0, 1.5, 2.0]))
    assert "label 1.5 of row 1 of" in message and "not a whole class id" in message, message


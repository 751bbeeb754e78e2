"""Slide files written byte by byte for tests: tiled (or stripped) TIFF and BigTIFF pyramids with
JPEG (YCbCr 4:2:0, from PIL), Deflate or uncompressed tiles, an Aperio description where a test
wants OpenSlide to read the file as SVS. Independent of tessera's writer (`tessera synth`)."""
import io
import struct
import zlib

import numpy as np
from PIL import Image

JPEG, DEFLATE, NONE = 7, 8, 1
APERIO = "Aperio Image Library v11.2.1 \r\n{width}x{height} ({tile}x{tile}) JPEG/RGB Q=90|AppMag = 20|MPP = 0.4990"


def encode(block, compression, quality=90):
    if compression == JPEG:
        data = io.BytesIO()
        Image.fromarray(block).save(data, "JPEG", quality=quality, subsampling=2)
        return data.getvalue()
    if compression == DEFLATE:
        return zlib.compress(block.tobytes())
    return block.tobytes()


def blocks(image, tile_width, tile_height):
    """The image cut into tile_width x tile_height blocks, row by row, padded with white."""
    height, width = image.shape[:2]
    for y in range(0, height, tile_height):
        for x in range(0, width, tile_width):
            block = np.full((tile_height, tile_width, 3), 255, np.uint8)
            part = image[y:y + tile_height, x:x + tile_width]
            block[:part.shape[0], :part.shape[1]] = part
            yield block


def write_tiff(path, levels, tile=256, compression=JPEG, description="", bigtiff=False, strip_rows=0, quality=90,
               empty=()):
    """Writes `levels` (H x W x 3 uint8 arrays, largest first; a (height, width) tuple declares a
    level whose tiles hold no data) as one directory each; `description`
    goes in the first. `tile` is one side for all levels or a list, one per level. strip_rows > 0
    stores the first level in strips of that many rows instead of tiles (a stripped TIFF).
    `empty` lists (level, tile index) pairs left out of the file (byte count 0)."""
    sides = list(tile) if isinstance(tile, (list, tuple)) else [tile] * len(levels)
    out = bytearray(b"II+\x00\x08\x00\x00\x00" + bytes(8) if bigtiff else b"II*\x00" + bytes(4))
    offset_format, count_format = ("Q", "Q") if bigtiff else ("I", "I")
    entry_format = "<HHQ8s" if bigtiff else "<HHI4s"
    inline = 8 if bigtiff else 4
    kinds = {"H": (3, 2), "I": (4, 4), "Q": (16, 8), "s": (2, 1)}
    next_pointer = 8 if bigtiff else 4  # where the previous directory's "next" offset lives
    for index, image in enumerate(levels):
        height, width = image if isinstance(image, tuple) else image.shape[:2]
        stripped = strip_rows > 0 and index == 0
        if isinstance(image, tuple):  # declared, no data
            tile = sides[index]
            pieces = [b""] * (-(-width // tile) * -(-height // tile))
        elif stripped:
            pieces = [encode(np.ascontiguousarray(image[y:y + strip_rows]), compression, quality)
                      for y in range(0, height, strip_rows)]
        else:
            tile = sides[index]
            pieces = [b"" if (index, i) in empty else encode(block, compression, quality)
                      for i, block in enumerate(blocks(image, tile, tile))]
        offsets = []
        for piece in pieces:
            offsets.append(len(out))
            out += piece
            if len(out) % 2:
                out += b"\x00"
        counts = [len(piece) for piece in pieces]
        long_kind = "Q" if bigtiff else "I"
        tags = [(254, "I", [0 if index == 0 else 1]), (256, "I", [width]), (257, "I", [height]),
                (258, "H", [8, 8, 8]), (259, "H", [compression]), (262, "H", [6 if compression == JPEG else 2])]
        if index == 0 and description:
            tags.append((270, "s", description.encode() + b"\x00"))
        tags += [(277, "H", [3]), (284, "H", [1])]
        if stripped:
            tags += [(273, long_kind, offsets), (278, "I", [strip_rows]), (279, long_kind, counts)]
        else:
            tags += [(322, "I", [tile]), (323, "I", [tile]), (324, long_kind, offsets), (325, long_kind, counts)]
        if compression == JPEG:
            tags.append((530, "H", [2, 2]))
        tags.sort()
        # Values too long for their entry go before the directory.
        entries = []
        for tag, kind, values in tags:
            kind_code, size = kinds[kind]
            data = values if kind == "s" else struct.pack(f"<{len(values)}{kind}", *values)
            if len(data) <= inline:
                entries.append((tag, kind_code, len(values), data.ljust(inline, b"\x00")))
            else:
                if len(out) % 2:
                    out += b"\x00"
                entries.append((tag, kind_code, len(values), struct.pack(f"<{offset_format}", len(out))))
                out += data
        if len(out) % 2:
            out += b"\x00"
        directory = len(out)
        struct.pack_into(f"<{offset_format}", out, next_pointer, directory)
        out += struct.pack(f"<{count_format}" if bigtiff else "<H", len(entries))
        for tag, kind_code, count, value in entries:
            out += struct.pack(entry_format, tag, kind_code, count, value)
        next_pointer = len(out)
        out += bytes(inline)
    with open(path, "wb") as f:
        f.write(out)


def pyramid(image, factors):
    """`image` and its box-filtered reductions by each of `factors` (sizes rounded down)."""
    base = Image.fromarray(image)
    levels = [image]
    for factor in factors:
        levels.append(np.asarray(base.resize((image.shape[1] // factor, image.shape[0] // factor), Image.BOX)))
    return levels


def ome_tiff(path, planes, edit=None, names=None, tile=(256, 256)):
    """An OME-TIFF of grey planes (C x H x W) as tifffile writes one: a main directory a plane,
    Channel elements, TiffData IFD 0 PlaneCount C. Its OME-XML is passed through `edit` (str to
    str, or to bytes for a description that is not UTF-8) and written back with
    tifffile.tiffcomment: the description a test wants, over planes that are really there."""
    import tifffile  # here: the TIFF writers above stay independent of it
    metadata = {"axes": "CYX"}
    if names is not None:
        metadata["Channel"] = {"Name": list(names)}
    tifffile.imwrite(path, planes, ome=True, photometric="minisblack", tile=tile, metadata=metadata)
    if edit is not None:
        with tifffile.TiffFile(path) as tiff:
            xml = tiff.pages[0].description
        tifffile.tiffcomment(path, edit(xml))
    return path

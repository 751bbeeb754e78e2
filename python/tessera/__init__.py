"""Python access to tessera's outputs (see python/README.md)."""
from tessera.slide_record import SlideRecord
from tessera.tile_store import TileStoreDataset, TileStoreError, find_tile_stores

__all__ = ["SlideRecord", "TileStoreDataset", "TileStoreError", "find_tile_stores"]

"""Python access to tessera's outputs (see python/README.md)."""
from tessera.tile_store import TileStoreDataset, TileStoreError, find_tile_stores

__all__ = ["TileStoreDataset", "TileStoreError", "find_tile_stores"]

"""TPU slice presets: `tpu_configs.load("v5e-8")`, `tpu_configs.names()`; see `loader`."""

from tpu_configs.loader import Preset, PresetError, load, names

__all__ = ["Preset", "PresetError", "load", "names"]

"""TPU slice presets: loading, validation, and the meshes and engine settings they describe.

Owns `Preset` and `load(name, **overrides)` / `names()`. Presets are data: one YAML file per
slice under `tpu_configs/presets/`. A preset says how many devices the slice has, how the
trainer (fsdp x tp) and the rollout engine (dp x tp) lay out over them, whether the two share
devices, the engine settings (sgl_jax_rollout's `EngineSettings` names) and the rollout
micro-batch size. On several hosts the trainer spans every device and each host runs its own
engine on its own devices (its first ones): the rollout mesh is one host's (docs/design.md
section 10).

Checks, each error naming the field:
- at load: meshes fill the slice's devices (shared: each mesh covers all; disjoint, one host
  only: the two together); on several hosts the rollout mesh fits on one host, with dp 1;
  every tp divides the device count, the engine settings are valid (paddings sorted, batch
  paddings covering `max_running_requests`, token paddings covering one prefill step, memory
  fraction in (0, 1)) and `max_running_requests` covers the rollout micro-batch;
- `check_model(model_dir)`: every tp divides the model's kv heads;
- `check_devices()`: the preset's device count equals `jax.device_count()`, and the process
  count is `hosts` (or 1: one process with every device, such as the single-process run a
  simulated pod is compared with), before any mesh or engine is built, so the user gets this
  message, not an XLA error.

Imports no jax at module level; `meshes()` and `check_devices()` import it when called.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from sgl_jax_rollout.engine.settings import EngineSettings

PRESET_DIR = Path(__file__).parent / "presets"
TRAINER_AXES = ("fsdp", "tp")
ROLLOUT_AXES = ("data", "tensor")  # sgl-jax's mesh axis names
_FIELDS = (
    "description",
    "slice",
    "hosts",
    "devices",
    "models",
    "shared_devices",
    "trainer_mesh",
    "rollout_mesh",
    "rollout_micro_batch_size",
    "engine",
)
_MESH_KEYS = {"trainer_mesh": ("fsdp", "tp"), "rollout_mesh": ("dp", "tp")}


class PresetError(ValueError):
    """A preset (or an override of it) is invalid, or does not fit this machine or model."""


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    description: str
    slice: str
    hosts: int
    devices: int
    models: str
    shared_devices: bool
    trainer_fsdp: int
    trainer_tp: int
    rollout_dp: int
    rollout_tp: int
    rollout_micro_batch_size: int
    engine: EngineSettings

    @property
    def trainer_devices(self) -> int:
        return self.trainer_fsdp * self.trainer_tp

    @property
    def rollout_devices(self) -> int:
        return self.rollout_dp * self.rollout_tp

    def rollout_device_ids(self) -> tuple[int, ...]:
        """Positions of the rollout engine's devices: in `jax.devices()` on one host; in
        `jax.local_devices()` (the host's own) on several, where every host runs an engine."""
        start = 0 if self.shared_devices or self.hosts > 1 else self.trainer_devices
        return tuple(range(start, start + self.rollout_devices))

    def rollout_device_list(self) -> list[Any]:
        """This process's rollout engine devices (`rollout_device_ids` of its device list)."""
        import jax

        devices = jax.local_devices() if self.hosts > 1 else jax.devices()
        if len(devices) < self.rollout_devices:
            raise PresetError(
                f"preset {self.name!r}: rollout_mesh needs {self.rollout_devices} devices of "
                f"this {'host' if self.hosts > 1 else 'process'}, it has {len(devices)}"
            )
        return [devices[i] for i in self.rollout_device_ids()]

    def engine_settings(self) -> EngineSettings:
        """The engine settings with the rollout mesh's devices (`tp_size` counts them all).

        On several hosts `device_indexes` is None here: each host's engine takes its devices
        from its rollout mesh (`meshes()`; `SglangJaxRollout(mesh=)` sets them)."""
        return self.engine.replace(
            tp_size=self.rollout_devices,
            dp_size=self.rollout_dp,
            device_indexes=None if self.hosts > 1 else self.rollout_device_ids(),
        )

    def check_devices(self, available: int | None = None, processes: int | None = None) -> None:
        """Raises `PresetError` unless this process sees the preset's device count, and (on
        several hosts) runs as one of `hosts` processes, or as the only one."""
        if available is None or processes is None:
            import jax

            available = jax.device_count() if available is None else available
            processes = jax.process_count() if processes is None else processes
        if available != self.devices:
            hint = (
                " Multi-host: call jax.distributed.initialize() on every host first."
                if self.hosts > 1
                else ""
            )
            raise PresetError(
                f"preset {self.name!r} needs devices: {self.devices} ({self.slice}), but this "
                f"process sees {available} (jax.device_count()). Pick the preset of this slice "
                f"(tpu_configs.names()), or override devices and the meshes.{hint}"
            )
        if processes not in (1, self.hosts):
            raise PresetError(
                f"preset {self.name!r} has hosts: {self.hosts}, but this process is one of "
                f"{processes} JAX processes (jax.process_count()); run one process per host"
            )

    def check_model(self, model_dir: str | Path) -> None:
        """Raises `PresetError` unless every tp divides the model's kv heads."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        tps = (("trainer_mesh.tp", self.trainer_tp), ("rollout_mesh.tp", self.rollout_tp))
        for field, tp in tps:
            if kv_heads % tp:
                raise PresetError(
                    f"preset {self.name!r}: {field} ({tp}) must divide the model's kv heads "
                    f"({kv_heads}, num_key_value_heads in {model_dir}/config.json)"
                )

    def meshes(self) -> tuple[Any, Any]:
        """(trainer mesh (fsdp, tp) over `jax.devices()`, rollout mesh (data, tensor) over
        `rollout_device_list()`: on several hosts, this host's own engine's devices).

        Auto axes: tunix's models index and gather without explicit output shardings.
        """
        import jax
        import numpy as np

        self.check_devices()
        devices = np.asarray(jax.devices())
        auto = (jax.sharding.AxisType.Auto,) * 2
        trainer = jax.sharding.Mesh(
            devices[: self.trainer_devices].reshape(self.trainer_fsdp, self.trainer_tp),
            TRAINER_AXES,
            axis_types=auto,
        )
        rollout = jax.sharding.Mesh(
            np.asarray(self.rollout_device_list()).reshape(self.rollout_dp, self.rollout_tp),
            ROLLOUT_AXES,
            axis_types=auto,
        )
        return trainer, rollout


def names() -> list[str]:
    """Every preset name, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load(name: str, **overrides: Any) -> Preset:
    """The preset `name`, with `overrides` applied, validated.

    Overrides use the YAML's field names; `trainer_mesh`, `rollout_mesh` and `engine` take
    dicts merged into the preset's, e.g. `load("v5e-8", engine={"page_size": 128},
    rollout_micro_batch_size=16)`.
    """
    path = PRESET_DIR / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        raise PresetError(f"unknown preset {name!r}; presets: {', '.join(names())}")
    raw = yaml.safe_load(path.read_text())
    return _build(name, _merged(raw, overrides))


def _merged(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(raw)
    for key, value in overrides.items():
        if key not in _FIELDS:
            raise PresetError(f"unknown preset field {key!r}; fields: {', '.join(_FIELDS)}")
        if key in ("trainer_mesh", "rollout_mesh", "engine"):
            if not isinstance(value, dict):
                raise PresetError(f"{key} override must be a dict, got {value!r}")
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return data


def _build(name: str, data: dict[str, Any]) -> Preset:
    def fail(field: str, message: str) -> PresetError:
        return PresetError(f"preset {name!r}: {field} {message}")

    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise fail(", ".join(missing), "missing")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise fail(", ".join(unknown), f"unknown; fields: {', '.join(_FIELDS)}")
    for field in ("hosts", "devices", "rollout_micro_batch_size"):
        _positive(data[field], field, fail)
    if not isinstance(data["shared_devices"], bool):
        raise fail("shared_devices", f"must be true or false, got {data['shared_devices']!r}")
    meshes = {}
    for field, keys in _MESH_KEYS.items():
        mesh = data[field]
        if not isinstance(mesh, dict) or set(mesh) != set(keys):
            raise fail(field, f"must have exactly the keys {list(keys)}, got {mesh!r}")
        for key in keys:
            _positive(mesh[key], f"{field}.{key}", fail)
        meshes[field] = mesh
    devices, hosts = data["devices"], data["hosts"]
    if devices % hosts:
        raise fail("devices", f"({devices}) must be a multiple of hosts ({hosts})")
    trainer, rollout = meshes["trainer_mesh"], meshes["rollout_mesh"]
    for field, tp in (("trainer_mesh.tp", trainer["tp"]), ("rollout_mesh.tp", rollout["tp"])):
        if devices % tp:
            raise fail(field, f"({tp}) must divide the device count ({devices})")
    used_t = trainer["fsdp"] * trainer["tp"]
    used_r = rollout["dp"] * rollout["tp"]
    if hosts > 1 and not data["shared_devices"]:
        raise fail(
            "shared_devices",
            "must be true on a multi-host slice (every host runs an engine on its own devices "
            "and the trainer spans them all)",
        )
    if data["shared_devices"]:
        if used_t != devices:
            raise fail("trainer_mesh", f"fsdp x tp = {used_t} must equal devices ({devices})")
        if hosts == 1 and used_r != devices:
            raise fail("rollout_mesh", f"dp x tp = {used_r} must equal devices ({devices})")
        if hosts > 1 and used_r > devices // hosts:
            raise fail(
                "rollout_mesh",
                f"dp x tp = {used_r} must fit on one host ({devices // hosts} devices): every "
                "host runs its own engine",
            )
        if hosts > 1 and rollout["dp"] > 1:
            # sgl-jax (scheduler.run_batch, pinned commit) gathers the sampled ids with
            # process_allgather over every JAX process at each step when dp_size > 1.
            raise fail(
                "rollout_mesh.dp",
                f"must be 1 on several hosts, got {rollout['dp']}: with dp > 1 sgl-jax gathers "
                "every step's tokens over all JAX processes, which ties the hosts' engines "
                "together step by step",
            )
    else:
        if used_t + used_r != devices:
            raise fail(
                "rollout_mesh",
                f"with shared_devices false, trainer ({used_t}) plus rollout ({used_r}) "
                f"devices must equal devices ({devices})",
            )
    engine = _engine_settings(data["engine"], fail)
    if engine.max_running_requests < data["rollout_micro_batch_size"]:
        raise fail(
            "engine.max_running_requests",
            f"({engine.max_running_requests}) must cover rollout_micro_batch_size "
            f"({data['rollout_micro_batch_size']})",
        )
    if engine.max_running_requests % rollout["dp"]:
        raise fail(
            "engine.max_running_requests",
            f"({engine.max_running_requests}) must be a multiple of rollout_mesh.dp "
            f"({rollout['dp']})",
        )
    return Preset(
        name=name,
        description=str(data["description"]),
        slice=str(data["slice"]),
        hosts=hosts,
        devices=devices,
        models=str(data["models"]),
        shared_devices=data["shared_devices"],
        trainer_fsdp=trainer["fsdp"],
        trainer_tp=trainer["tp"],
        rollout_dp=rollout["dp"],
        rollout_tp=rollout["tp"],
        rollout_micro_batch_size=data["rollout_micro_batch_size"],
        engine=engine,
    )


def _engine_settings(values: Any, fail) -> EngineSettings:
    if not isinstance(values, dict):
        raise fail("engine", f"must be a mapping of engine settings, got {values!r}")
    placement = sorted({"tp_size", "dp_size", "device_indexes"} & set(values))
    if placement:
        raise fail(f"engine.{placement[0]}", "comes from the meshes; set rollout_mesh instead")
    values = dict(values)
    if values.get("mem_fraction_static") is not None:
        values.setdefault("max_total_tokens", None)
    try:
        engine = EngineSettings().replace(**values)
    except (TypeError, ValueError) as error:
        raise fail("engine:", str(error)) from None
    step = engine.max_prefill_tokens
    if engine.chunked_prefill_size > 0:
        step = min(step, engine.chunked_prefill_size)
    paddings = engine.precompile_token_paddings
    if paddings is not None and paddings[-1] < step:
        raise fail(
            "engine.precompile_token_paddings",
            f"must cover one prefill step ({step} tokens: chunked_prefill_size or "
            f"max_prefill_tokens), largest is {paddings[-1]}",
        )
    return engine


def _positive(value: Any, field: str, fail) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(field, f"must be an integer >= 1, got {value!r}")

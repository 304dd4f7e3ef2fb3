"""Engine starts against one persistent compilation cache, each changing one thing: which of
the engine's programs each start read from the cache. Run by test_compilation_cache.py in a
subprocess of its own (two simulated CPU devices; JAX's cache settings fresh).

Prints one JSON object: for each start, the cache hits of the model's forward programs, all
hits, all misses, and the cache folder."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import jax

from sgl_jax_rollout.engine.engine import RolloutEngine
from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.tiny_model import make_tiny_model
from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compiles import count_compiles
from tests.conftest import one_bucket_settings

FORWARD = "jit_jitted_run_model"
SMALL = EngineSettings(**one_bucket_settings(1, 128, 128, 1024), overlap_schedule=False)


class Hits(logging.Handler):
    """JAX logs each persistent-cache hit with the program's name (`compiler.py`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Persistent compilation cache hit"):
            self.names.append(str(record.args[0]))


def start(model: Path, hits: Hits, **changes) -> dict:
    hits.names.clear()
    with count_compiles() as compiles:
        engine = RolloutEngine(model, SMALL.replace(**changes))
    engine.shutdown()
    jax.clear_caches()  # the next start finds nothing in memory: only the persistent cache
    assert compiles.cache_hits == len(hits.names), "JAX logged other hits than it counted"
    return {
        "forward_hits": hits.names.count(FORWARD),
        "hits": len(hits.names),
        "misses": compiles.cache_misses,
        "folder": str(jax.config.jax_compilation_cache_dir),
    }


def main() -> None:
    work = Path(sys.argv[1])
    qwen3 = make_tiny_model(work / "qwen3", arch="qwen3")
    llama = make_tiny_model(work / "llama", arch="llama")
    hits = Hits()
    compiler_log = logging.getLogger("jax._src.compiler")
    compiler_log.setLevel(logging.DEBUG)
    compiler_log.addHandler(hits)
    cache = {"compilation_cache_dir": str(work / "cache")}
    starts = {
        "cold": start(qwen3, hits, **cache),
        "warm": start(qwen3, hits, **cache),
        "dtype": start(qwen3, hits, dtype="bfloat16", **cache),
        "model": start(llama, hits, **cache),
        "mesh": start(qwen3, hits, tp_size=2, **cache),
    }
    compilation_cache.sgl_jax_build = lambda: "0.0.3.dev0+g00000000"  # another sgl-jax commit
    starts["sgl_jax"] = start(qwen3, hits, **cache)
    print(json.dumps(starts))


if __name__ == "__main__":
    main()

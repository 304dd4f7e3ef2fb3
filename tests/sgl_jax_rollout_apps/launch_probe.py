"""A process started by `sgl-jax-rollout launch` in tests/sgl_jax_rollout_apps/test_launch.py:
`python -m tests.sgl_jax_rollout_apps.launch_probe MODE [PID_FILE]`.

MODE `sum`: joins the JAX processes, sums a value from every device of the whole system (a
collective across the processes) and prints it; `fail`: process 1 exits with 3 at once while
the others wait to join it (they hang until ended); `sleep`: every process sleeps a minute.
Each writes its pid to PID_FILE.<rank> first, so the test can check that none survives.
"""

import os
import sys
import time

from sgl_jax_rollout_apps.launch import PROCESS_ID, initialize_from_env

mode = sys.argv[1]
rank = int(os.environ[PROCESS_ID])
if len(sys.argv) > 2:
    with open(f"{sys.argv[2]}.{rank}", "w") as f:
        f.write(str(os.getpid()))
if mode == "fail" and rank == 1:
    sys.exit(3)
if mode == "sleep":
    time.sleep(60)
initialize_from_env()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("x",))
values = jax.make_array_from_callback(
    (jax.device_count(),), NamedSharding(mesh, P("x")), lambda index: np.arange(8)[index]
)
total = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, P()))(values)
print(
    f"RESULT processes={jax.process_count()} devices={jax.device_count()} "
    f"local={jax.local_device_count()} sum={int(total.addressable_data(0))}",
    flush=True,
)

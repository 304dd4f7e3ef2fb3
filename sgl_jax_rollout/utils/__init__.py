"""Small helpers shared by the sampler, the engine and the benchmarks."""

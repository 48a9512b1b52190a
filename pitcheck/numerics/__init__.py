"""Numbers and their units: element formats and rounding (formats), the fp8/MX/NVFP4 recipes (scaling), which
of PIT's tensors pass through which recipe (placement, quantisers, native_float8), precision policies
(policy), the numpy/torch namespace (arrays), the metrics, the float64 reference and the growth fit (stats).

Nothing is imported here: `import pitcheck` stays free of numpy and torch.
"""

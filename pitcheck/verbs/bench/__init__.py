"""`pitcheck bench`: cost as ratios to a GEMM floor (benchmark), and a whole run's step and a batch's stack
step (runcost)."""

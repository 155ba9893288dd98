"""rapid bench / rapid sim: real-run benchmarks and the calibrated simulator."""

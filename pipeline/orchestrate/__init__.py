"""The build's orchestration: plan, lock, publish; partitions, Ray and rebuilds."""

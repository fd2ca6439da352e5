"""What a block costs on a device: FLOPs, bytes, time, memory. Speaks in shapes, not in nas objects."""

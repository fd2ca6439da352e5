"""What a device can do: shipped hardware profiles and their schema."""

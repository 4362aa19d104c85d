//! The bottleneck emulator (to be written).

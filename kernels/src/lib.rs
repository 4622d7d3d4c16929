//! Peregrine's compute and data layer: scalar reference and `wide` SIMD gradient kernels, and the
//! memory-mapped dataset format with its converters and generators. Nothing here yet.

//! CUDA collectives (in progress)

//! symm-rocm (placeholder)

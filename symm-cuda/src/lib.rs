//! symm-cuda (placeholder)

//! symm-ops (placeholder)

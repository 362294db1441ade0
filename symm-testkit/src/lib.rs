//! symm-testkit (placeholder)

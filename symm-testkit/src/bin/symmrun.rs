//! symmrun (being written)
fn main() {}

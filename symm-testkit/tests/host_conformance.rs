//! The conformance suite on the host backend, at world sizes 1, 2, 3, 5 and
//! 8, with ranks as threads and as processes.

symm_testkit::conformance_tests!(host, symm_testkit::conformance::Backend::host(), [1, 2, 3, 5, 8]);

//! Test doubles of the contract, compiled only for tests (and the `test-doubles`
//! feature the integration tests build with): the scripted [`fake`] cloud and the
//! [`faulty`] wrapper that injects failures into a real adapter's answers.

pub mod fake;
pub mod faulty;

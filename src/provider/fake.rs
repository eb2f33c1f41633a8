//! A scripted provider for engine tests.

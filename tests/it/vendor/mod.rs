//! Vendor-only behaviour of the HTTP adapters, against each vendor's spec-checked local
//! server: what the conformance suite (`conformance`) does not hold every cloud to
//! (RunPod's unmapped ports, Hyperstack's floating IP and delete refusal, DigitalOcean's
//! `type=gpus` and pagination, Lambda's ruleset in use, ...). Each module also owns its
//! fake server and world, which its conformance driver seeds.

pub mod digitalocean;
pub mod gcp;
pub mod hyperstack;
pub mod lambda;
pub mod massedcompute;
pub mod nebius;
pub mod primeintellect;
pub mod runpod;
pub mod verda;

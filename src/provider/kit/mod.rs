//! The adapter kit: the plumbing every cloud adapter shares, so an adapter is only its
//! vendor mapping.
//!
//! - [`adapter`]: what an adapter states about itself (name, endpoint override,
//!   capabilities, credential report), read by the contract's provided methods;
//! - [`http`]: the REST client (auth styles, the redacted credential, timeouts,
//!   `Retry-After` / `RateLimit-*`, the vendor's error body and success envelope hooks);
//! - [`failure`]: one [`failure::Failure`] (HTTP, gRPC or transport) and the table-driven
//!   [`failure::Classifier`] into the contract's error kinds;
//! - [`grpc`]: the gRPC channels (TLS or plain HTTP/2), the bearer token and idempotency
//!   key as metadata, and a call's transport failure (Nebius);
//! - [`paginate`]: page-number, next-link and token pagination, bounded;
//! - [`keys`]: the project's SSH key found by value or registered;
//! - [`oauth`]: OAuth2 client credentials, the access token cached and renewed;
//! - [`token_cache`]: a short-lived access token kept until its renewal and renewed once
//!   for concurrent callers (GCP, Nebius);
//! - [`listing`]: `observe` and `delete` over one unfiltered listing of instances;
//! - [`credentials`]: a credential plus where it was found, and the report for
//!   `gpuprov validate`;
//! - [`gpu`]: GPU-name normalisation and the "no such type" error;
//! - [`settings`]: an API-key adapter's key lookup (variable, else the vendor's file) and
//!   its self-description and credential from its settings;
//! - [`offer`], [`ports`]: an on-demand offer, the inbound port list (22 plus the VM's).
//!
//! Nothing here loops beyond one call's pagination (and the bounded key registration,
//! which lists before each attempt), sleeps or retries: the executor does.

pub mod adapter;
pub mod credentials;
pub mod failure;
pub mod gpu;
pub mod grpc;
pub mod http;
pub mod keys;
pub mod listing;
pub mod oauth;
pub mod offer;
pub mod paginate;
pub mod ports;
pub mod settings;
#[cfg(test)]
pub mod testing;
pub mod token_cache;

pub use adapter::Adapter;
pub use credentials::{Credential, CredentialReport, Lookup, Source};
pub use failure::{Call, Classifier, Failure, Rule, Status};
pub use http::{Auth, RestClient, TokenCall, TokenSource};

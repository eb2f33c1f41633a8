//! One gRPC call as the adapter makes it: the channel per service, the IAM token, the
//! deadline, the error's classification, and one listing's pagination.

use super::*;

impl NebiusProvider {
    pub(super) fn channel(&self, service: Service) -> std::result::Result<Channel, Failure> {
        self.channels.get(&self.url(service))
    }

    /// A token for the next call (module docs of [`auth`]).
    pub(super) async fn token(&self) -> std::result::Result<Secret, Failure> {
        let Some(tokens) = &self.tokens else {
            return Err(Failure::no_credential(self.missing.clone()));
        };
        tokens
            .token(|req| async move {
                // Only an exchange needs the token service (a ready token does not).
                let channel = self.channel(Service::Tokens)?;
                let req = grpc::request(req, None, None)?;
                iam::token_exchange_service_client::TokenExchangeServiceClient::new(channel)
                    .exchange(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| errors::of_status(&s))
            })
            .await
    }

    /// One call to `service`: `send` gets the channel and `msg` as a request with the
    /// bearer token (and `idempotency` key). A refused token that had worked is
    /// [`codes::STALE_TOKEN`] (retried by the core with a new one).
    pub(super) async fn call<M, T, F, Fut>(
        &self,
        service: Service,
        msg: M,
        idempotency: Option<&str>,
        send: F,
    ) -> std::result::Result<T, Failure>
    where
        F: FnOnce(Channel, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let token = self.token().await?;
        let channel = self.channel(service)?;
        let req = grpc::request(
            msg,
            Some(&token),
            idempotency.map(|k| (IDEMPOTENCY_HEADER, k)),
        )?;
        match send(channel, req).await {
            Ok(r) => {
                if let Some(t) = &self.tokens {
                    t.worked(&token);
                }
                Ok(r.into_inner())
            }
            Err(s) => {
                let mut f = errors::of_status(&s);
                let unauthenticated = s.code() == tonic::Code::Unauthenticated;
                if unauthenticated && self.tokens.as_ref().is_some_and(|t| t.rejected(&token)) {
                    f.code = Some(codes::STALE_TOKEN.into());
                }
                Err(f)
            }
        }
    }

    /// Every item of one paginated list call to `service`: `request` makes the request
    /// of a page from its token, `send` sends it, `page` reads the items and the next
    /// token of an answer. Errors: the call's, classified as `call`.
    pub(super) async fn list_all<M, R, T, F, Fut>(
        &self,
        service: Service,
        call: Call<'_>,
        request: impl Fn(String) -> M,
        send: F,
        page: impl Fn(R) -> (Vec<T>, String),
    ) -> Result<Vec<T>>
    where
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let (request, send, page) = (&request, &send, &page);
        paginate::all_pages(call.what, |cursor| async move {
            let token = match cursor {
                Cursor::Token(t) => t,
                _ => String::new(),
            };
            let answer = self
                .call(service, request(token), None, send)
                .await
                .map_err(|f| self.fail(&f, call))?;
            let (items, next) = page(answer);
            Ok((items, Next::Token(next)))
        })
        .await
    }
}

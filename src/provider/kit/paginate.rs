//! Pagination of one listing call, bounded: page numbers, next links and tokens. This is
//! the only loop an adapter may contain (one call's pagination; the provider contract).

use std::future::Future;

use super::super::{ErrorKind, ProviderError};

/// Most pages one listing may take before it is refused as runaway (a server that keeps
/// answering "next" would otherwise never end).
pub const MAX_PAGES: u32 = 100;

/// Which page to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// The first page (no page or token parameter).
    First,
    /// Page number `n` (1-based).
    Page(u32),
    /// The token the previous page returned.
    Token(String),
}

/// What a page says about the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Done,
    Page(u32),
    Token(String),
}

/// Every item of a listing: `fetch` is called with [`Cursor::First`], then with what
/// each page named as next, until a page says [`Next::Done`] (or names a page it has
/// already been, or an empty token). Errors: `fetch`'s own; `Failed` after
/// [`MAX_PAGES`] pages (`what` names the listing).
pub async fn all_pages<T, F, Fut>(what: &str, mut fetch: F) -> Result<Vec<T>, ProviderError>
where
    F: FnMut(Cursor) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Next), ProviderError>>,
{
    let mut out = Vec::new();
    let mut cursor = Cursor::First;
    let mut page_no = 1u32;
    for _ in 0..MAX_PAGES {
        let (items, next) = fetch(cursor).await?;
        out.extend(items);
        cursor = match next {
            Next::Page(n) if n > page_no => {
                page_no = n;
                Cursor::Page(n)
            }
            Next::Token(t) if !t.is_empty() => Cursor::Token(t),
            _ => return Ok(out),
        };
    }
    Err(ProviderError::new(
        ErrorKind::Failed,
        format!("{what}: more than {MAX_PAGES} pages; refusing a listing that does not end"),
    ))
}

/// The page number of a next link (`https://api.example.com/v2/sizes?page=2&per_page=20`
/// → 2). Only the number is read: the link's host is never dialled.
pub fn page_of_link(next: &str) -> Option<u32> {
    let query = next.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pages_tokens_and_the_bound() {
        let got = all_pages("list", |c| async move {
            Ok(match c {
                Cursor::First => (vec![1], Next::Page(2)),
                Cursor::Page(2) => (vec![2], Next::Token("t".into())),
                Cursor::Token(_) => (vec![3], Next::Page(2)),
                Cursor::Page(_) => unreachable!(),
            })
        })
        .await
        .unwrap();
        assert_eq!(
            got,
            [1, 2, 3],
            "a page number already seen ends the listing"
        );

        let e = all_pages("list sizes", |_| async {
            Ok((vec![0], Next::Token("again".into())))
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Failed);
        assert!(
            e.msg.starts_with("list sizes: more than 100 pages"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn next_links_give_only_their_page_number() {
        assert_eq!(
            page_of_link("https://evil.example/v2/sizes?per_page=200&page=3"),
            Some(3)
        );
        assert_eq!(page_of_link("https://api/v2/sizes"), None);
        assert_eq!(page_of_link("/v2/sizes?page=x"), None);
    }
}

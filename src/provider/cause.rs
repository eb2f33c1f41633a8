//! Short causes for cloud API failures: what a user needs to act on (status, the vendor's
//! code, the first line of a body that is not JSON and its content type), never a dumped
//! HTML page or an SDK's `Debug` chain. Shared by the REST adapters.

/// At most this many characters of a non-JSON body's first line are shown.
pub const MAX_BODY_LINE: usize = 160;

/// A one-line cause for a non-2xx answer with `body` whose JSON envelope the adapter could
/// not read: `HTTP 502 (text/html): <first non-blank line, tags stripped, ≤160 chars>`.
/// An empty body gives `HTTP 502 (empty body)`.
pub fn http_cause(status: u16, content_type: Option<&str>, body: &str) -> String {
    let ct = content_type
        .map(|c| c.split(';').next().unwrap_or(c).trim().to_string())
        .filter(|c| !c.is_empty());
    let line = first_line(body);
    match (ct, line) {
        (_, None) => format!("HTTP {status} (empty body)"),
        (Some(ct), Some(l)) => format!("HTTP {status} ({ct}): {l}"),
        (None, Some(l)) => format!("HTTP {status}: {l}"),
    }
}

/// The first non-blank line of `body` with HTML tags removed, shortened to
/// [`MAX_BODY_LINE`] characters; `None` when nothing readable is left.
pub fn first_line(body: &str) -> Option<String> {
    let mut text = String::new();
    let mut in_tag = false;
    for c in body.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    let line = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|l| !l.is_empty())?;
    if line.chars().count() > MAX_BODY_LINE {
        let cut: String = line.chars().take(MAX_BODY_LINE).collect();
        Some(format!("{cut}…"))
    } else {
        Some(line)
    }
}

/// Whether a transport error means the endpoint refused the connection (or its name did
/// not resolve): nothing was sent, and the whole cloud is unreachable
/// ([`super::ErrorKind::Unreachable`]). A connect *timeout* is not counted: it may be a
/// blip, and stays transient.
pub fn is_refused(e: &reqwest::Error) -> bool {
    e.is_connect() && !e.is_timeout()
}

/// The `Display` of every level of an error chain joined by `: `, without the `Debug`
/// dump the SDK's `DisplayErrorContext` appends, and without a level whose text the
/// previous one already shows.
pub fn display_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_pages_become_one_line() {
        let body = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>";
        assert_eq!(
            http_cause(502, Some("text/html; charset=utf-8"), body),
            "HTTP 502 (text/html): 502 Bad Gateway"
        );
    }

    #[test]
    fn empty_and_long_bodies() {
        assert_eq!(http_cause(503, None, "  \n "), "HTTP 503 (empty body)");
        let long = "x".repeat(500);
        let c = http_cause(500, Some("text/plain"), &long);
        assert!(c.ends_with('…') && c.chars().count() < 200, "{c}");
        assert_eq!(
            http_cause(404, None, "not found\nmore"),
            "HTTP 404: not found"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert!(is_refused(&e), "{e:?}");
    }
}

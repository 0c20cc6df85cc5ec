//! The small pages the edge answers with itself, for the byte relay (as
//! HTTP/1.1 bytes) and the hyper path (as responses).

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

use crate::registry::Registry;

/// The hyper path's response body type.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// A small self-explanatory HTML page the edge answers with itself.
pub(crate) struct Page {
    status: StatusCode,
    title: &'static str,
    text: String,
    retry_after: Option<&'static str>,
}

impl Page {
    fn new(status: StatusCode, title: &'static str, text: String) -> Self {
        Self {
            status,
            title,
            text,
            retry_after: None,
        }
    }

    pub(crate) fn no_host() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "The request names no host.".into(),
        )
    }

    pub(crate) fn bad_request(reason: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "Bad request",
            format!("The request cannot be forwarded: {reason}."),
        )
    }

    pub(crate) fn head_too_large() -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large",
            "The request head is too large.".into(),
        )
    }

    /// 503 for a host whose tunnel is gone (it may come back), else 404.
    pub(crate) fn not_routed(registry: &Registry, host: &str) -> Self {
        if registry.host_went_offline(host) {
            return Self {
                retry_after: Some("5"),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Tunnel offline",
                    format!(
                        "The tunnel serving {host} is not connected right now. Try again shortly."
                    ),
                )
            };
        }
        Self::new(
            StatusCode::NOT_FOUND,
            "No tunnel for this host",
            format!("No tunnel serves {host} on this edge."),
        )
    }

    /// 504: the agent took too long to answer.
    pub(crate) fn gateway_timeout(host: &str) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Tunnel timeout",
            format!("The tunnel agent serving {host} did not answer in time."),
        )
    }

    pub(crate) fn bad_gateway(host: &str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "Tunnel unreachable",
            format!("The tunnel agent serving {host} did not answer."),
        )
    }

    fn html(&self) -> String {
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{code} {title}</title></head>\
             <body><h1>{code} {title}</h1><p>{text}</p><hr><p>tuna edge</p></body></html>\n",
            code = self.status.as_u16(),
            title = escape(self.title),
            text = escape(&self.text),
        )
    }

    /// The page for the hyper path.
    pub(crate) fn response(&self) -> Response<Body> {
        let mut resp = Response::new(
            Full::new(Bytes::from(self.html()))
                .map_err(|never| match never {})
                .boxed(),
        );
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(secs));
        }
        resp
    }

    /// The page as HTTP/1.1 bytes, for the relay; `close` announces that
    /// the connection ends after it; without `body` (the answer to HEAD)
    /// only the head goes out.
    pub(crate) fn to_http1(&self, close: bool, body: bool) -> Vec<u8> {
        let html = self.html();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: text/html; charset=utf-8\r\ncache-control: no-store\r\ncontent-length: {}\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            html.len()
        );
        if let Some(secs) = self.retry_after {
            out.push_str(&format!("retry-after: {secs}\r\n"));
        }
        if close {
            out.push_str("connection: close\r\n");
        }
        out.push_str("\r\n");
        if body {
            out.push_str(&html);
        }
        out.into_bytes()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

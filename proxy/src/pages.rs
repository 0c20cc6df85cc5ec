//! The short pages and reason phrases the proxy answers with itself, the
//! same on both paths.

/// The body of a page the proxy answers `status` with.
pub(crate) fn error_page(status: u16) -> &'static str {
    match status {
        400 => "400 Bad Request: the request cannot be forwarded as sent.\n",
        421 => "421 Misdirected Request: this connection does not serve that host.\n",
        500 => "500 Internal Server Error: the route has no usable backend.\n",
        502 => "502 Bad Gateway: the upstream refused the connection or is unreachable.\n",
        504 => "504 Gateway Timeout: the upstream did not answer in time.\n",
        408 => "408 Request Timeout\n",
        431 => "431 Request Header Fields Too Large\n",
        505 => "505 HTTP Version Not Supported\n",
        _ => "",
    }
}

/// The reason phrase of a status the proxy answers itself.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        404 => "Not Found",
        408 => "Request Timeout",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

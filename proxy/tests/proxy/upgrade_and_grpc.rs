//! WebSocket (Upgrade) echo and a gRPC round trip over an h2c upstream.

use crate::common;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tuna_proxy::{HttpBackend, PathType, ProxyConfig, UpstreamProtocol};

async fn websocket_echo_backend() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_text() || msg.is_binary() {
                        if ws.send(msg).await.is_err() {
                            return;
                        }
                    } else if msg.is_close() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn websocket_echo_through_the_proxy() {
    let ws_backend = websocket_echo_backend().await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "ws.example.com",
        vec![route(
            "ws.example.com",
            "/",
            PathType::Prefix,
            &[ws_backend],
        )],
    )
    .unwrap();

    let mut request = format!("ws://{addr}/chat").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("host", "ws.example.com".parse().unwrap());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(response.status(), 101);
    for i in 0..20 {
        let text = format!("hello {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text(text));
    }
    let big = vec![7u8; 1 << 20];
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(big));
    ws.close(None).await.unwrap();
}

/// A gRPC-shaped h2c server: echoes the request message, ends with
/// `grpc-status: 0` trailers.
async fn grpc_backend() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(tcp).await.unwrap();
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    tokio::spawn(async move {
                        let path = req.uri().path().to_owned();
                        let te = req.headers().get("te").cloned();
                        let mut body = req.into_body();
                        let mut data = BytesMut::new();
                        while let Some(chunk) = body.data().await {
                            let chunk = chunk.unwrap();
                            body.flow_control().release_capacity(chunk.len()).unwrap();
                            data.extend_from_slice(&chunk);
                        }
                        let response = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .header("x-path", path)
                            .header(
                                "x-te",
                                te.map_or("none".into(), |v| v.to_str().unwrap().to_owned()),
                            )
                            .body(())
                            .unwrap();
                        let mut send = respond.send_response(response, false).unwrap();
                        send.send_data(data.freeze(), false).unwrap();
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        trailers.insert("grpc-message", "ok".parse().unwrap());
                        send.send_trailers(trailers).unwrap();
                    });
                }
            });
        }
    });
    addr
}

fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

#[tokio::test]
async fn grpc_round_trip_over_h2c_upstream() {
    let grpc = grpc_backend().await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let mut r = route("grpc.example.com", "/", PathType::Prefix, &[grpc]);
    r.backend = HttpBackend {
        addrs: vec![grpc],
        protocol: UpstreamProtocol::H2c,
        gateway: None,
    };
    core.set_host_routes("grpc.example.com", vec![r]).unwrap();

    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    for i in 0..3 {
        let request = http::Request::builder()
            .method("POST")
            .uri("http://grpc.example.com/echo.Echo/Say")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        let message = format!("ping {i}");
        send.send_data(grpc_frame(message.as_bytes()), true)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert_eq!(response.headers()["x-path"], "/echo.Echo/Say");
        assert_eq!(
            response.headers()["x-te"],
            "trailers",
            "TE: trailers reaches gRPC"
        );
        let mut body = response.into_body();
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
            data.extend_from_slice(&chunk);
        }
        assert_eq!(data.freeze(), grpc_frame(message.as_bytes()));
        let trailers = body.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["grpc-message"], "ok");
        client = client.ready().await.unwrap();
    }
}

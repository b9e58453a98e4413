//! An axum app served on a free loopback port with connect info (the peer address the layer
//! keys by), for as long as the test's runtime lives.

use std::net::SocketAddr;

pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let service = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, service).await.unwrap();
    });
    addr
}

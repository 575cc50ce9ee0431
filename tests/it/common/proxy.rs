//! A TCP proxy that a test can cut and heal, to partition one server from others on loopback.
//! While cut it drops its open connections and resets new ones.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
};

pub struct Proxy {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of `ip` and forwards to `target`.
    pub async fn start(ip: Ipv4Addr, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((ip, 0)).await.expect("proxy bind");
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        let cut_rx = Arc::new(cut_rx);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut cut = (*cut_rx).clone();
                if *cut.borrow() {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    let pipe = async {
                        tokio::select! {
                            _ = tokio::io::copy(&mut ri, &mut wo) => {}
                            _ = tokio::io::copy(&mut ro, &mut wi) => {}
                        }
                    };
                    tokio::select! {
                        _ = pipe => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { addr, cut, task }
    }

    /// `http://addr/eureka/` through this proxy.
    pub fn url(&self) -> String {
        format!("http://{}/eureka/", self.addr)
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

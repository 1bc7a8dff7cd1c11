//! What the node does with network events while it starts up (settling on
//! its peers, then fetching the replica state): requests are answered at
//! once, everything else is kept for the running node.

use ragtag_protocol::wire::{ErrorReply, Message};

use crate::net::{self, Client};

/// Network events kept while starting, handled once the node runs: a
/// reachability verdict or relay reservation that lands in the first
/// seconds must not be lost (AutoNAT answers within about 2 s).
pub(crate) const BACKLOG: usize = 1024;

/// Events held back until the node runs.
#[derive(Debug, Default)]
pub(crate) struct StartupInbox {
    backlog: Vec<net::Event>,
    dropped: usize,
}

impl StartupInbox {
    /// Answers a request with NotFound (a starting node has no state to
    /// serve; two nodes starting together would otherwise each wait out the
    /// request timeout for the other) and keeps any other event.
    pub(crate) async fn take(&mut self, net: &Client, ev: net::Event) {
        match ev {
            net::Event::Request { id, .. } => {
                let _ = net.respond(id, Message::Error(ErrorReply::NotFound)).await;
            }
            other if self.backlog.len() < BACKLOG => self.backlog.push(other),
            _ => self.dropped += 1,
        }
    }

    /// The kept events, oldest first; says how many did not fit.
    pub(crate) fn into_events(self) -> Vec<net::Event> {
        if self.dropped > 0 {
            tracing::warn!(
                "{} network events arrived while starting up beyond the {BACKLOG} kept; dropped",
                self.dropped
            );
        }
        self.backlog
    }
}

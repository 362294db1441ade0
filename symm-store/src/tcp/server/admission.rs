//! Admission: accepting connections, the pending and per-address caps, eviction, and dropping
//! a client (the module docs of `server` give the rules).

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::*;

impl Server {
    pub(super) fn pause_accept(&mut self) {
        let _ = self.epoll.delete(&self.listener);
        self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
    }

    pub(super) fn accept_all(&mut self, dirty: &mut HashSet<ClientId>) {
        for _ in 0..ACCEPT_BUDGET {
            match self.listener.accept() {
                Ok((s, peer)) => self.admit(s, peer, dirty),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(e) if is_fd_exhaustion(&e) => {
                    // At the fd limit Linux fails `accept` with EMFILE before it looks at
                    // the backlog, so this also follows the accept that took the last
                    // descriptor. Evicting then would push out a pending connection (that
                    // very one, its handshake still in flight) for a newcomer that does
                    // not exist: act only when one waits. The listener stays registered,
                    // so one arriving later brings us back here.
                    if !self.connection_waiting() {
                        return;
                    }
                    // Out of descriptors: evict a pending connection to free one, else
                    // refuse the newcomer through the spare descriptor; only if both fail
                    // (another thread took the descriptor) pause instead of spinning on a
                    // listener that stays readable.
                    self.counters.fd_exhausted.fetch_add(1, Ordering::Relaxed);
                    if self.free_slot(None, dirty) || self.refuse_with_spare() {
                        continue;
                    }
                    self.pause_accept();
                    return;
                }
                Err(_) => {
                    self.pause_accept();
                    return;
                }
            }
        }
    }

    /// True if a connection waits in the listen backlog (the listener is readable). Needs
    /// no descriptor, so it works at the fd limit. An error counts as "waiting" (the
    /// caller then frees a slot or refuses, as it did before this check).
    pub(super) fn connection_waiting(&self) -> bool {
        let mut p = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        loop {
            match nix::poll::poll(&mut p, PollTimeout::ZERO) {
                Ok(_) => return p[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)),
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return true,
            }
        }
    }

    /// Admits a newly accepted connection, evicting pending connections or refusing it
    /// as the caps require.
    pub(super) fn admit(&mut self, s: TcpStream, peer: SocketAddr, dirty: &mut HashSet<ClientId>) {
        let ip = peer.ip().to_canonical();
        let peer_total = |srv: &Server| srv.peers.get(&ip).map_or(0, |p| p.total);
        let peer_pending = |srv: &Server| srv.peers.get(&ip).map_or(0, |p| p.pending.len());
        if peer_total(self) >= self.opts.max_clients_per_peer && !self.free_slot(Some(ip), dirty) {
            let n = peer_total(self);
            return self.refuse(s, || format!("{ip} already has {n} connections (max_clients_per_peer)"));
        }
        while peer_pending(self) >= self.opts.max_pending_per_peer.max(1) && self.shrink_pending(Some(ip), dirty) {}
        while self.pending.len() >= self.opts.max_pending.max(1) && self.shrink_pending(None, dirty) {}
        if self.clients.len() >= self.opts.max_clients && !self.free_slot(None, dirty) {
            let n = self.clients.len();
            return self.refuse(s, || format!("{n} clients connected (max_clients)"));
        }
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let _ = s.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        if self.epoll.add(&s, EpollEvent::new(EpollFlags::EPOLLIN, id)).is_err() {
            return;
        }
        self.clients.insert(
            id,
            Client {
                stream: s,
                peer: ip,
                accepted_at: Instant::now(),
                inbuf: Vec::new(),
                need: 0,
                partial_since: None,
                out: Vec::new(),
                out_pos: 0,
                validated: false,
                established: false,
                want_out: false,
            },
        );
        self.pending.insert(id);
        let p = self.peers.entry(ip).or_default();
        p.total += 1;
        p.pending.insert(id);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        self.update_gauges();
    }

    /// Closes a just-accepted connection at once: the client sees the connection closed
    /// before its handshake is answered.
    pub(super) fn refuse(&mut self, s: TcpStream, why: impl FnOnce() -> String) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        if self.debug {
            eprintln!("symm-store server: refusing a connection: {}", why());
        }
        drop(s);
    }

    /// Out of descriptors and nothing to evict: closes the spare descriptor, accepts one
    /// queued connection with it, closes that (a clear refusal instead of a client left
    /// in the backlog) and takes the spare back. False if that did not work.
    pub(super) fn refuse_with_spare(&mut self) -> bool {
        let Some(spare) = self.spare.take() else { return false };
        drop(spare);
        let got = loop {
            match self.listener.accept() {
                Ok((s, _)) => break Some(s),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break None,
            }
        };
        let refused = got.is_some();
        if let Some(s) = got {
            self.refuse(s, || {
                "out of file descriptors and no pending connection to evict".into()
            });
        }
        self.spare = self.listener.as_fd().try_clone_to_owned().ok();
        refused
    }

    /// The oldest pending connection (of `ip` if given).
    pub(super) fn oldest_pending(&self, ip: Option<IpAddr>) -> Option<ClientId> {
        match ip {
            Some(ip) => self.peers.get(&ip).and_then(|p| p.pending.first().copied()),
            None => self.pending.first().copied(),
        }
    }

    /// Reads a pending connection one last time: a client whose handshake has arrived
    /// is served and stays.
    pub(super) fn examine(&mut self, id: ClientId, dirty: &mut HashSet<ClientId>) -> Examined {
        self.on_readable(id, dirty);
        match self.clients.get(&id) {
            None => Examined::Gone,
            Some(c) if c.established => Examined::Established,
            Some(_) => Examined::Pending,
        }
    }

    /// One pending connection (of `ip` if given) fewer: established or evicted. False if
    /// there is none.
    pub(super) fn shrink_pending(&mut self, ip: Option<IpAddr>, dirty: &mut HashSet<ClientId>) -> bool {
        let Some(id) = self.oldest_pending(ip) else {
            return false;
        };
        if let Examined::Pending = self.examine(id, dirty) {
            self.evict(id);
        }
        true
    }

    /// Frees one connection slot (of `ip` if given) by evicting the oldest pending
    /// connection that is still pending once read. False if there is none.
    pub(super) fn free_slot(&mut self, ip: Option<IpAddr>, dirty: &mut HashSet<ClientId>) -> bool {
        while let Some(id) = self.oldest_pending(ip) {
            match self.examine(id, dirty) {
                Examined::Gone => return true,
                Examined::Established => {}
                Examined::Pending => {
                    self.evict(id);
                    return true;
                }
            }
        }
        false
    }

    pub(super) fn evict(&mut self, id: ClientId) {
        let age = self
            .clients
            .get(&id)
            .map_or(Duration::ZERO, |c| c.accepted_at.elapsed());
        self.drop_client(
            id,
            DropReason::Evicted(format!("evicted for a newcomer: handshake not completed after {age:?}")),
        );
    }

    pub(super) fn update_gauges(&self) {
        let c = &self.counters;
        c.active.store(self.clients.len() as u64, Ordering::Relaxed);
        c.pending.store(self.pending.len() as u64, Ordering::Relaxed);
    }

    /// The connection completed its handshake.
    pub(super) fn establish(&mut self, id: ClientId, c: &mut Client) {
        c.established = true;
        self.pending.remove(&id);
        if let Some(p) = self.peers.get_mut(&c.peer) {
            p.pending.remove(&id);
        }
        // (`c` is out of `clients` while it is served: only the pending gauge is right.)
        self.counters
            .pending
            .store(self.pending.len() as u64, Ordering::Relaxed);
    }

    pub(super) fn drop_client(&mut self, id: ClientId, why: DropReason) {
        let c = &self.counters;
        let (counter, reason) = match why {
            DropReason::Malformed(r) => (&c.dropped_malformed, Some(r)),
            DropReason::Slow(r) => (&c.dropped_slow, Some(r)),
            DropReason::Overflow(r) => (&c.dropped_overflow, Some(r)),
            DropReason::Idle(r) => (&c.dropped_idle, Some(r)),
            DropReason::Evicted(r) => (&c.evicted, Some(r)),
            DropReason::Closed => (&c.closed, None),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = reason {
            if self.debug {
                eprintln!("symm-store server: dropping client {id}: {r}");
            }
            if let Ok(mut g) = c.last_drop.lock() {
                *g = Some(r);
            }
        }
        self.db.clear_wait(id);
        if let Some(cl) = self.clients.remove(&id) {
            let _ = self.epoll.delete(&cl.stream);
            self.pending.remove(&id);
            if let Some(p) = self.peers.get_mut(&cl.peer) {
                p.total = p.total.saturating_sub(1);
                p.pending.remove(&id);
                if p.total == 0 {
                    self.peers.remove(&cl.peer);
                }
            }
        }
        self.update_gauges();
    }
}

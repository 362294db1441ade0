//! Reading clients, parsing and serving their requests, flushing replies, and the periodic sweep
//! of stalled frames and handshakes.

use super::*;

impl Server {
    pub(super) fn on_readable(&mut self, id: ClientId, dirty: &mut HashSet<ClientId>) {
        let mut chunk = std::mem::take(&mut self.chunk);
        if chunk.len() != READ_CHUNK {
            chunk = vec![0u8; READ_CHUNK];
        }
        self.read_client(id, &mut chunk, dirty);
        self.chunk = chunk;
    }

    pub(super) fn read_client(&mut self, id: ClientId, chunk: &mut [u8], dirty: &mut HashSet<ClientId>) {
        let Some(mut c) = self.clients.remove(&id) else { return };
        let mut eof = false;
        let mut budget = READ_BUDGET;
        while budget > 0 {
            match c.stream.read(chunk) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.inbuf.extend_from_slice(&chunk[..n]);
                    budget = budget.saturating_sub(n);
                    // Never buffer more than one maximal frame ahead of parsing.
                    if c.inbuf.len() >= c.need.max(1) {
                        let r = self.parse_and_serve(id, &mut c, dirty);
                        if let Err(why) = r {
                            self.clients.insert(id, c);
                            self.drop_client(id, why);
                            return;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        self.clients.insert(id, c);
        if eof {
            self.drop_client(id, DropReason::Closed);
        } else {
            dirty.insert(id);
        }
    }

    /// Serves every complete frame in `c.inbuf`; keeps the incomplete tail.
    pub(super) fn parse_and_serve(
        &mut self,
        id: ClientId,
        c: &mut Client,
        dirty: &mut HashSet<ClientId>,
    ) -> std::result::Result<(), DropReason> {
        let mut off = 0usize;
        let mut progressed = false;
        loop {
            if off == c.inbuf.len() {
                c.need = 0;
                break;
            }
            // A connection must open with VALIDATE: garbage is dropped at its first byte.
            if !c.validated && c.inbuf[off] != QueryType::Validate as u8 {
                return Err(DropReason::Malformed(format!(
                    "first request is not VALIDATE (type {})",
                    c.inbuf[off]
                )));
            }
            match parse_request(&c.inbuf[off..], &self.opts.limits) {
                Ok(Parsed::Complete(req, n)) => {
                    off += n;
                    progressed = true;
                    self.counters.requests.fetch_add(1, Ordering::Relaxed);
                    self.serve(id, c, req, dirty)?;
                }
                Ok(Parsed::Incomplete { need }) => {
                    c.need = need;
                    break;
                }
                Err(e) => return Err(DropReason::Malformed(frame_reason(&e))),
            }
        }
        c.inbuf.drain(..off);
        if c.inbuf.is_empty() {
            c.partial_since = None;
        } else if progressed || c.partial_since.is_none() {
            c.partial_since = Some(Instant::now());
        }
        if c.out.len() - c.out_pos > self.opts.max_out_buffer {
            return Err(DropReason::Overflow(format!(
                "{} bytes of unread replies",
                c.out.len() - c.out_pos
            )));
        }
        Ok(())
    }

    pub(super) fn serve(
        &mut self,
        id: ClientId,
        c: &mut Client,
        req: Request,
        dirty: &mut HashSet<ClientId>,
    ) -> std::result::Result<(), DropReason> {
        if !c.validated {
            return match req {
                Request::Validate(VALIDATION_MAGIC) => {
                    c.validated = true;
                    Ok(())
                }
                Request::Validate(m) => Err(DropReason::Malformed(format!("bad VALIDATE magic {m:#x}"))),
                _ => Err(DropReason::Malformed("first request is not VALIDATE".into())),
            };
        }
        if !c.established {
            self.establish(id, c);
        }
        let db = &mut self.db;
        let out = &mut c.out;
        let mut woken = Vec::new();
        match req {
            Request::Validate(_) => {}
            Request::Ping(n) => out.extend_from_slice(&n.to_le_bytes()),
            Request::Set { key, value } => {
                db.wake_all(&key, &mut woken);
                db.kv.insert(key, value);
            }
            Request::CompareSet { key, expected, desired } => {
                let reply = compare_set_bytes(&mut db.kv, &key, &expected, &desired);
                db.wake_all(&key, &mut woken);
                put_bytes(out, &reply);
            }
            Request::Get { key } => put_bytes(out, db.kv.get(&key).map_or(&[][..], |v| v.as_slice())),
            Request::Add { key, delta } => {
                let base = match db.kv.get(&key) {
                    None => 0,
                    Some(v) => parse_decimal(v)
                        .ok_or_else(|| DropReason::Malformed("ADD on a value that is not a decimal integer".into()))?,
                };
                let v = base.wrapping_add(delta);
                db.kv.insert(key.clone(), v.to_string().into_bytes());
                db.wake_all(&key, &mut woken);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Request::Check { keys } => out.push(if keys.iter().all(|k| db.present(k)) {
                CHECK_READY
            } else {
                CHECK_NOT_READY
            }),
            Request::Wait { keys } => {
                db.clear_wait(id);
                if keys.iter().all(|k| db.present(k)) {
                    out.push(STOP_WAITING);
                } else {
                    let mut n = 0usize;
                    for k in keys {
                        if !db.kv.contains_key(&k) {
                            db.waiting.entry(k).or_default().push(id);
                            n += 1;
                        }
                    }
                    db.awaited.insert(id, n);
                }
            }
            Request::GetNumKeys => out.extend_from_slice(&i64_of(db.kv.len()).to_le_bytes()),
            Request::DeleteKey { key } => {
                let n: i64 = if db.kv.remove(&key).is_some() { 1 } else { 0 };
                out.extend_from_slice(&n.to_le_bytes());
            }
            Request::Append { key, value } => {
                db.kv.entry(key.clone()).or_default().extend_from_slice(&value);
                db.wake_all(&key, &mut woken);
            }
            Request::MultiGet { keys } => {
                for k in keys {
                    put_bytes(out, db.kv.get(&k).map_or(&[][..], |v| v.as_slice()));
                    if out.len() - c.out_pos > self.opts.max_out_buffer {
                        return Err(DropReason::Overflow(
                            "MULTI_GET reply exceeds the output buffer limit".into(),
                        ));
                    }
                }
            }
            Request::MultiSet { kvs } => {
                for (k, v) in kvs {
                    db.wake_all(&k, &mut woken);
                    db.kv.insert(k, v);
                }
            }
            Request::CancelWait => {
                db.clear_wait(id);
                out.push(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                db.queues.entry(key.clone()).or_default().push_back(value);
                db.wake_one(&key, &mut woken);
            }
            Request::QueuePop { key } => {
                let q = db.queues.get_mut(&key);
                let len = q.as_ref().map_or(0, |q| q.len());
                out.extend_from_slice(&i64_of(len).to_le_bytes());
                if let Some(q) = q {
                    if let Some(v) = q.pop_front() {
                        put_bytes(out, &v);
                    }
                    if q.is_empty() {
                        db.queues.remove(&key);
                    }
                }
            }
            Request::QueueLen { key } => {
                out.extend_from_slice(&i64_of(db.queues.get(&key).map_or(0, |q| q.len())).to_le_bytes())
            }
        }
        for w in woken {
            if w == id {
                c.out.push(STOP_WAITING);
            } else if let Some(other) = self.clients.get_mut(&w) {
                other.out.push(STOP_WAITING);
                dirty.insert(w);
            }
        }
        Ok(())
    }

    pub(super) fn flush(&mut self, id: ClientId) {
        let Some(c) = self.clients.get_mut(&id) else { return };
        while c.out_pos < c.out.len() {
            match c.stream.write(&c.out[c.out_pos..]) {
                Ok(0) => break,
                Ok(n) => c.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.drop_client(id, DropReason::Closed);
                    return;
                }
            }
        }
        if c.out_pos == c.out.len() {
            c.out.clear();
            c.out_pos = 0;
        } else if c.out_pos > (1 << 20) {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        let pending = c.out.len() - c.out_pos;
        if pending > self.opts.max_out_buffer {
            self.drop_client(id, DropReason::Overflow(format!("{pending} bytes of unread replies")));
            return;
        }
        if (pending > 0) != c.want_out {
            c.want_out = pending > 0;
            let fl = if c.want_out {
                EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
            } else {
                EpollFlags::EPOLLIN
            };
            let _ = self.epoll.modify(&c.stream, &mut EpollEvent::new(fl, id));
        }
    }

    /// Drops connections past their deadlines: pending ones past `first_frame_timeout`
    /// (no VALIDATE yet) or `handshake_timeout`, and any client with a frame left
    /// incomplete past `frame_timeout`. Established clients between frames are never
    /// touched.
    pub(super) fn sweep(&mut self, now: Instant) {
        let ff = self.opts.first_frame_timeout;
        let hs = self.opts.handshake_timeout;
        let earliest = ff.min(hs);
        let mut idle = Vec::new();
        // Pending ids grow with accept time: stop at the first one too young to expire.
        for &id in &self.pending {
            let Some(c) = self.clients.get(&id) else { continue };
            let age = now.saturating_duration_since(c.accepted_at);
            if age <= earliest {
                break;
            }
            if !c.validated && age > ff {
                idle.push((id, format!("no VALIDATE within the first-frame timeout ({ff:?})")));
            } else if age > hs {
                idle.push((id, format!("handshake not completed within {hs:?}")));
            }
        }
        for (id, why) in idle {
            self.drop_client(id, DropReason::Idle(why));
        }
        let limit = self.opts.frame_timeout;
        let slow: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| {
                c.partial_since
                    .is_some_and(|t| now.saturating_duration_since(t) > limit)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in slow {
            self.drop_client(
                id,
                DropReason::Slow(format!("frame left incomplete for more than {limit:?}")),
            );
        }
        if self.spare.is_none() {
            self.spare = self.listener.as_fd().try_clone_to_owned().ok();
        }
    }
}

fn frame_reason(e: &FrameError) -> String {
    format!("malformed frame: {e}")
}

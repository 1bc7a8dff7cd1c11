//! The status page a node serves at `/`: one self-contained HTML document
//! (no scripts, no external resources, so it works offline) that refreshes
//! itself, with the held-out loss drawn as an SVG chart by the server.

use std::fmt::Write;

use crate::status::{Status, human_bytes};

/// Seconds between the page's own refreshes.
const REFRESH_S: u32 = 5;
/// The chart's size in pixels, and its margin for labels.
const W: f64 = 640.0;
const H: f64 = 240.0;
const M: f64 = 40.0;

/// Text made safe inside HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A long peer id cut to its ends (the whole id is in the cell's title).
fn short(id: &str) -> String {
    let chars: Vec<char> = id.chars().collect();
    if chars.len() <= 20 {
        return id.into();
    }
    format!("{}…{}", chars[..12].iter().collect::<String>(), chars[chars.len() - 6..].iter().collect::<String>())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".into(), |v| v.to_string())
}

/// The held-out loss against wall time, as an inline SVG.
pub fn loss_chart(points: &[(f64, f32)]) -> String {
    let mut svg = format!(
        r#"<svg id="loss-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" data-points="{}">"#,
        points.len()
    );
    let _ = write!(
        svg,
        r##"<rect x="{M}" y="10" width="{}" height="{}" fill="#fafafa" stroke="#999"/>"##,
        W - M - 10.0,
        H - M - 10.0
    );
    if points.is_empty() {
        let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="middle">no evaluation yet</text>"#, W / 2.0, H / 2.0);
        svg.push_str("</svg>");
        return svg;
    }
    let t_max = points.iter().map(|p| p.0).fold(1e-9, f64::max);
    let (lo, hi) =
        points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.1 as f64), hi.max(p.1 as f64)));
    let span = (hi - lo).max(1e-6);
    let x = |t: f64| M + (W - M - 10.0) * t / t_max;
    let y = |l: f64| 10.0 + (H - M - 10.0) * (1.0 - (l - lo) / span);
    let coords: Vec<String> = points.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1 as f64))).collect();
    let _ = write!(
        svg,
        r##"<polyline id="loss" fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
        coords.join(" ")
    );
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{hi:.3}</text><text x="{}" y="{}" font-size="11" text-anchor="end">{lo:.3}</text>"#,
        M - 4.0,
        y(hi) + 4.0,
        M - 4.0,
        y(lo) + 4.0
    );
    let _ = write!(
        svg,
        r#"<text x="{M}" y="{}" font-size="11">0 s</text><text x="{}" y="{}" font-size="11" text-anchor="end">{t_max:.0} s</text><text x="{}" y="{}" font-size="11" text-anchor="middle">held-out loss against wall time</text>"#,
        H - M + 16.0,
        W - 10.0,
        H - M + 16.0,
        (W + M) / 2.0,
        H - 6.0
    );
    svg.push_str("</svg>");
    svg
}

fn row(out: &mut String, k: &str, v: &str) {
    let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
}

/// The whole page.
pub fn html(s: &Status) -> String {
    let mut out = String::with_capacity(8192);
    let _ = write!(
        out,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}"><title>ragtag · {}</title><style>body{{font-family:sans-serif;margin:1.5em;max-width:70em}}table{{border-collapse:collapse;margin:.5em 0 1.5em}}th,td{{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}}h2{{margin-bottom:.2em}}.bad{{color:#b00}}</style></head><body>"#,
        esc(&s.run_name)
    );
    let _ = write!(out, "<h1>ragtag {} — {}</h1><p>{}</p>", esc(&s.version), esc(&s.run_name), esc(&s.state));
    out.push_str("<h2>Run</h2><table id=\"run\">");
    row(&mut out, "name", &s.run_name);
    row(&mut out, "run id", &s.run_id);
    row(&mut out, "strategy", &s.strategy);
    row(&mut out, "model", &s.model);
    row(&mut out, "data", &s.data);
    out.push_str("</table><h2>This node</h2><table id=\"node\">");
    row(&mut out, "peer id", &s.peer_id);
    row(&mut out, "device", &s.device);
    row(&mut out, "speed", &format!("{:.1} inner steps/s", s.speed));
    row(&mut out, "utilisation", &format!("{:.0}%", 100.0 * s.utilisation));
    row(&mut out, "idle, share of uptime", &s.idle_text());
    row(&mut out, "rounds", &format!("{} (training round {}, {} outer rounds)", s.rounds, s.round, s.outer_rounds));
    row(&mut out, "samples", &s.samples.to_string());
    row(&mut out, "updates applied", &s.applied.to_string());
    row(&mut out, "train loss", &opt(s.train_loss.map(|v| format!("{v:.4}"))));
    row(&mut out, "held-out loss", &opt(s.eval_loss.map(|v| format!("{v:.4}"))));
    row(&mut out, "inner learning rate", &format!("{} x the manifest's", s.inner_lr_scale));
    row(&mut out, "credit", &opt(s.credit.map(|c| format!("{c:.0} (samples x applied weight, k = 1)"))));
    row(&mut out, "ledger records", &s.ledger_records.to_string());
    row(&mut out, "uptime", &format!("{:.0} s", s.uptime_s));
    out.push_str("</table><h2>Held-out loss</h2>");
    out.push_str(&loss_chart(&s.eval_history));
    out.push_str("<h2>Network</h2><table id=\"network\">");
    row(&mut out, "reachability", &s.reachability);
    row(&mut out, "listening on", &s.listen_addrs.join(" "));
    row(&mut out, "peers", &format!("{} connected, {} live members of the run", s.connected_peers, s.live_nodes));
    row(
        &mut out,
        "traffic",
        &format!(
            "{}/s out, {}/s in ({} and {} in all)",
            human_bytes(s.bytes_out_per_s as u64),
            human_bytes(s.bytes_in_per_s as u64),
            human_bytes(s.bytes_out),
            human_bytes(s.bytes_in)
        ),
    );
    if !s.bytes_in_by_connection.is_empty() {
        let by: Vec<String> =
            s.bytes_in_by_connection.iter().map(|(k, v)| format!("{} {k}", human_bytes(*v))).collect();
        row(&mut out, "received by connection", &by.join(", "));
    }
    if s.hole_punch.succeeded + s.hole_punch.failed > 0 {
        let last = s.hole_punch.last.as_deref().unwrap_or("");
        row(
            &mut out,
            "hole punching",
            &format!("{} direct, {} failed; latest: {last}", s.hole_punch.succeeded, s.hole_punch.failed),
        );
    }
    out.push_str("</table><h2>Peers</h2><table id=\"peers\"><tr><th>peer</th><th>connection</th><th>gossip score</th><th>speed (steps/s)</th><th>last heard</th><th>updates applied</th><th>mean staleness</th><th>rejected</th></tr>");
    for p in &s.peers {
        let _ = write!(
            out,
            "<tr class=\"peer\"><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td{}>{}</td></tr>",
            esc(&p.peer_id),
            esc(&short(&p.peer_id)),
            match (&p.connection, p.connected) {
                (Some(kind), _) => esc(kind),
                (None, true) => "yes".into(),
                (None, false) => "not connected".into(),
            },
            opt(p.score.map(|v| format!("{v:.1}"))),
            opt(p.speed.map(|v| format!("{v:.1}"))),
            opt(p.last_seen_s.map(|v| format!("{v:.0} s ago"))),
            p.applied,
            opt(p.mean_staleness.map(|v| format!("{v:.2}"))),
            if p.rejected > 0 { " class=\"bad\"" } else { "" },
            p.rejected
        );
    }
    out.push_str("</table><h2>Rejected inputs</h2><table id=\"rejected\">");
    if s.rejected.is_empty() {
        out.push_str("<tr><td>none</td></tr>");
    }
    for (reason, n) in &s.rejected {
        row(&mut out, reason, &n.to_string());
    }
    let _ = write!(
        out,
        "</table><p>Machine-readable: <a href=\"/status\">/status</a> (JSON), <a href=\"/metrics\">/metrics</a> (Prometheus). This page refreshes every {REFRESH_S} s.</p></body></html>"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::PeerStatus;

    #[test]
    fn the_page_escapes_names_and_draws_every_evaluation() {
        let s = Status {
            run_name: "<script>x</script>".into(),
            eval_history: vec![(1.0, 2.3), (2.0, 1.9), (4.0, 1.4)],
            peers: vec![
                PeerStatus { peer_id: "12D3KooWpeer".into(), connected: true, ..PeerStatus::default() },
                PeerStatus {
                    peer_id: "12D3KooWfar".into(),
                    connected: true,
                    connection: Some("relayed".into()),
                    applied: 4,
                    mean_staleness: Some(0.25),
                    ..PeerStatus::default()
                },
            ],
            ..Status::default()
        };
        let page = html(&s);
        assert!(!page.contains("<script>"), "a run name is text, not markup");
        assert!(page.contains("&lt;script&gt;"));
        assert!(page.contains(r#"data-points="3""#));
        let points = page.split(r#" points=""#).nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(points.split(' ').count(), 3);
        assert!(page.contains(r#"<td title="12D3KooWpeer">12D3KooWpeer</td><td>yes</td>"#));
        assert!(page.contains(r#"<td title="12D3KooWfar">12D3KooWfar</td><td>relayed</td>"#));
        assert_eq!(short("12D3KooWQ2BoggGEQuxym1nuVTCv7it2vDkr3RDMNxioMoQHYnyb"), "12D3KooWQ2Bo…QHYnyb");
        assert!(page.contains("<td>4</td><td>0.25</td>"), "applied and mean staleness");
        assert!(loss_chart(&[]).contains("no evaluation yet"));
    }
}

import { useMutation, useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { client, unwrap, type Run } from "../lib/api";
import type { components } from "../lib/schema";
import { canCancel, useAuth } from "../lib/auth";
import { readViewOnly, shareUrl, viewOnlyUrl } from "../lib/chartState";
import { fmtTime } from "../lib/format";
import { queryClient } from "../lib/query";
import { readShareToken, shareLinkUrl } from "../lib/share";

type ShareListed = components["schemas"]["ShareListed"];

/** Copies the link to this view (zoom, smoothing, x axis, log y, combined metrics, series switched off:
 * lib/chartState.ts), or its view-only form (the same charts, no button that changes the run). Where the clipboard
 * is refused (an http page on another host), the link is shown selected to copy by hand. The run's submitter, an
 * approver or an admin may also make a share link (POST /api/runs/{id}/share): the same view, read-only, for someone
 * with no account, until it expires or they revoke the run's share links. */
export function ShareLink({ run }: { run: Run }) {
  const { identity } = useAuth();
  const [shown, setShown] = useState<string | null>(null);
  const [copied, setCopied] = useState("");
  const [shared, setShared] = useState<{ url: string; expires: string } | null>(null);
  const [revoked, setRevoked] = useState<number | null>(null);
  const copy = async (url: string, what: string) => {
    try {
      await navigator.clipboard.writeText(url);
      setCopied(what);
      setShown(null);
      window.setTimeout(() => setCopied(""), 2000);
    } catch {
      setShown(url);
    }
  };
  const path = { run_id: run.id };
  // not on a view-only page (nor a shared one: nobody is signed in there)
  const mayShare = canCancel(identity, run) && !readViewOnly() && readShareToken() === null;
  const live = useQuery({
    queryKey: ["shares", run.id],
    queryFn: () => unwrap(client.GET("/api/runs/{run_id}/share", { params: { path } })),
    enabled: mayShare,
  });
  const reread = () => queryClient.invalidateQueries({ queryKey: ["shares", run.id] });
  const share = useMutation({
    mutationFn: () => unwrap(client.POST("/api/runs/{run_id}/share", { params: { path }, body: { days: 30 } })),
    onSuccess: (s) => {
      setShared({ url: shareLinkUrl(s.token), expires: s.expires_at });
      setRevoked(null);
      // the new link is live: the revoke button counts it at once, before the list is read again
      const made: ShareListed = { id: s.id, prefix: s.prefix, created_by: s.created_by, created_at: s.created_at,
        expires_at: s.expires_at };
      queryClient.setQueryData<ShareListed[]>(["shares", run.id], (old) =>
        [...(old ?? []).filter((x) => x.id !== s.id), made]);
      void reread();
    },
  });
  const unshare = useMutation({
    mutationFn: () => unwrap(client.DELETE("/api/runs/{run_id}/share", { params: { path } })),
    onSuccess: (r) => {
      setShared(null);
      setRevoked(r.revoked);
      queryClient.setQueryData(["shares", run.id], []);  // none is live now: the button goes at once
      void reread();
    },
  });
  const links = live.data?.length ?? 0;
  const error = share.error?.message ?? unshare.error?.message ?? "";
  return (
    <span className="share-link">
      <button type="button" data-testid="copy-link" onClick={() => copy(shareUrl(), "link")} title="a link that opens this run with the same zoom and series">
        {copied === "link" ? "Link copied" : "Copy link"}
      </button>
      <button type="button" data-testid="copy-view-link" onClick={() => copy(viewOnlyUrl(), "view")}
        title="the same view for readers: the charts, without the buttons that change the run">
        {copied === "view" ? "View-only link copied" : "Copy view-only link"}
      </button>
      {mayShare ? (
        <button type="button" data-testid="create-share-link" disabled={share.isPending}
          title="a view-only link for someone with no account: it opens this run and nothing else, for 30 days"
          onClick={() => share.mutate()}>
          Share link (no sign-in)
        </button>
      ) : null}
      {mayShare && links > 0 ? (
        <button type="button" data-testid="revoke-share-links" data-links={links} disabled={unshare.isPending}
          title="every share link of this run stops opening it" onClick={() => unshare.mutate()}>
          Revoke share links ({links})
        </button>
      ) : null}
      {shown !== null ? (
        <input readOnly data-testid="share-url" value={shown} aria-label="link to this view" autoFocus
          onFocus={(e) => e.currentTarget.select()} />
      ) : null}
      {shared ? (
        <span className="share-made" data-testid="share-made">
          <input readOnly data-testid="share-link-url" value={shared.url} aria-label="share link (no sign-in)" autoFocus
            onFocus={(e) => e.currentTarget.select()} />
          <span className="muted small">opens this run read-only, with no sign-in, until {fmtTime(shared.expires)}</span>
        </span>
      ) : null}
      {revoked !== null ? <span className="muted small" data-testid="share-revoked">
        {revoked === 1 ? "1 share link revoked" : `${revoked} share links revoked`}</span> : null}
      {error ? <span className="field-error" data-testid="share-error">{error}</span> : null}
    </span>
  );
}

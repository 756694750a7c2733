import type { Middleware } from "openapi-fetch";
import { viewUrl } from "./chartState";
import { parseHash } from "./route";

// A run's share link (POST /api/runs/{id}/share): "#/runs/12?share=ulab_share_...". It opens the run's page
// read-only for anyone who has it, signed in or not: every API call the page makes carries the token, as a bearer
// header (the typed client's middleware below), or as ?share= where no header can go (the live stream's
// EventSource, a download link). The token reads that one run only (backend/runs/share.py).

export const SHARE_PARAM = "share";

/** The share token in the page's URL, or null (not a share link). */
export function readShareToken(): string | null {
  return parseHash(window.location.hash).query.get(SHARE_PARAM) || null;
}

/** `url` carrying the share token as ?share= when the page was opened by a share link (else `url` as it is). */
export function withShare(url: string): string {
  const token = readShareToken();
  if (!token) return url;
  return `${url}${url.includes("?") ? "&" : "?"}${SHARE_PARAM}=${encodeURIComponent(token)}`;
}

/** The typed client's requests carry the share token of a share link (it stands in for a signed-in session). */
export const shareAuth: Middleware = {
  onRequest({ request }) {
    const token = readShareToken();
    if (token) request.headers.set("Authorization", `Bearer ${token}`);
    return request;
  },
};

/** The link to this view (its zoom, series, axes) that opens it read-only with `token`. */
export function shareLinkUrl(token: string): string {
  return viewUrl({ [SHARE_PARAM]: token }, ["view"]);
}

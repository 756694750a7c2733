import { useState } from "react";
import { shareUrl, viewOnlyUrl } from "../lib/chartState";

/** Copies the link to this view (zoom, smoothing, x axis, log y, combined metrics, series switched off:
 * lib/chartState.ts), or its view-only form (the same charts, no button that changes the run). Where the clipboard
 * is refused (an http page on another host), the link is shown selected to copy by hand. */
export function ShareLink() {
  const [shown, setShown] = useState<string | null>(null);
  const [copied, setCopied] = useState("");
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
  return (
    <span className="share-link">
      <button type="button" data-testid="copy-link" onClick={() => copy(shareUrl(), "link")} title="a link that opens this run with the same zoom and series">
        {copied === "link" ? "Link copied" : "Copy link"}
      </button>
      <button type="button" data-testid="copy-view-link" onClick={() => copy(viewOnlyUrl(), "view")}
        title="the same view for readers: the charts, without the buttons that change the run">
        {copied === "view" ? "View-only link copied" : "Copy view-only link"}
      </button>
      {shown !== null ? (
        <input readOnly data-testid="share-url" value={shown} aria-label="link to this view" autoFocus
          onFocus={(e) => e.currentTarget.select()} />
      ) : null}
    </span>
  );
}

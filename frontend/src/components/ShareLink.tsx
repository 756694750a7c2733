import { useState } from "react";
import { shareUrl } from "../lib/chartState";

/** Copies the link to this view (zoom, smoothing, planner lines, series switched off: lib/chartState.ts). Where the
 * clipboard is refused (an http page on another host), the link is shown selected to copy by hand. */
export function ShareLink() {
  const [shown, setShown] = useState<string | null>(null);
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    const url = shareUrl();
    try {
      await navigator.clipboard.writeText(url);
      setCopied(true);
      setShown(null);
      window.setTimeout(() => setCopied(false), 2000);
    } catch {
      setShown(url);
    }
  };
  return (
    <span className="share-link">
      <button type="button" data-testid="copy-link" onClick={copy} title="a link that opens this run with the same zoom and series">
        {copied ? "Link copied" : "Copy link"}
      </button>
      {shown !== null ? (
        <input readOnly data-testid="share-url" value={shown} aria-label="link to this view" autoFocus
          onFocus={(e) => e.currentTarget.select()} />
      ) : null}
    </span>
  );
}

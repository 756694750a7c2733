import { useMutation } from "@tanstack/react-query";
import { useEffect, useRef, useState } from "react";
import { client, unwrap } from "../lib/api";
import { useAuth } from "../lib/auth";
import { navigate } from "../lib/route";

/** #/signin[?token=...&next=/runs]: keeps the API token in an httpOnly cookie (POST /api/session). */
export function SignIn({ query }: { query: URLSearchParams }) {
  const { identity, refresh } = useAuth();
  const [token, setToken] = useState("");
  const next = query.get("next") || "/planner";
  const tried = useRef<string | null>(null);  // the last link token tried

  const { mutate: signIn, isPending: busy, error } = useMutation({
    mutationFn: (t: string) => unwrap(client.POST("/api/session", { body: { token: t.trim() } })),
    onSuccess: async () => {
      await refresh();
      navigate(next);
    },
  });

  // A link with ?token= (what `make run` prints) signs in at once; the token leaves the address bar. Keyed on the
  // token: a second link opened in the same tab (the hash changes, the page stays) is tried too, e.g. the right
  // link after a wrong one.
  const linkToken = query.get("token");
  useEffect(() => {
    if (linkToken && tried.current !== linkToken) {
      tried.current = linkToken;
      window.history.replaceState(null, "", `${window.location.pathname}#/signin?next=${encodeURIComponent(next)}`);
      signIn(linkToken);
    }
  }, [linkToken, next, signIn]);

  return (
    <div className="signin card" data-testid="signin-page">
      <h2>Sign in</h2>
      {identity ? (
        <p>Signed in as <b>{identity.name}</b> ({identity.role}). A different token replaces this sign-in.</p>
      ) : (
        <p className="muted">Paste an API token (<code>ulab token create --role submitter --name you</code>).</p>
      )}
      <form onSubmit={(e) => { e.preventDefault(); signIn(token); }}>
        <input type="password" autoComplete="off" placeholder="API token" data-testid="signin-token"
          value={token} onChange={(e) => setToken(e.target.value)} />
        <button type="submit" className="primary" data-testid="signin-submit" disabled={busy || !token.trim()}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
      </form>
      {error ? <div className="field-error" data-testid="signin-error">{error.message}</div> : null}
    </div>
  );
}

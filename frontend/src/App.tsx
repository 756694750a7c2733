import { useMutation } from "@tanstack/react-query";
import { client, unwrap } from "./lib/api";
import { AuthProvider, useAuth } from "./lib/auth";
import { navigate, useRoute } from "./lib/route";
import { SHARE_PARAM } from "./lib/share";
import { CalibrationPage } from "./pages/Calibration";
import { WorkersPage } from "./pages/Workers";
import { Compare } from "./pages/Compare";
import { Planner } from "./pages/planner/Planner";
import { Plans } from "./pages/Plans";
import { RunPage } from "./pages/run/RunPage";
import { Runs } from "./pages/Runs";
import { SignIn } from "./pages/SignIn";

function Who() {
  const { identity, refresh } = useAuth();
  const signOut = useMutation({
    mutationFn: () => unwrap(client.DELETE("/api/session")),
    onSuccess: async () => {
      await refresh();
      navigate("/signin");
    },
  });
  if (identity === undefined) return null;
  if (!identity) return <a className="who" href="#/signin" data-testid="signin-link">Sign in</a>;
  return (
    <span className="who" data-testid="whoami" data-role={identity.role}>
      {identity.name} <span className="muted">({identity.role})</span>{" "}
      {identity.token_id == null ? (
        <a href="#/signin" data-testid="signin-link">sign in</a> // open reads: anonymous viewer
      ) : (
        <button type="button" className="link" data-testid="signout" disabled={signOut.isPending} onClick={() => signOut.mutate()}>sign out</button>
      )}
      {signOut.error ? <span className="field-error" data-testid="signout-error"> {signOut.error.message}</span> : null}
    </span>
  );
}

function SignInBanner({ page, shared }: { page: string; shared: boolean }) {
  const { identity, unauthorized } = useAuth();
  if (shared || page === "signin" || identity || !(unauthorized || identity === null)) return null;
  const here = window.location.hash.replace(/^#/, "") || "/planner";
  return (
    <div className="card warn" data-testid="signin-banner">
      You are not signed in: the API answers only signed-in users.{" "}
      <a href={`#/signin?next=${encodeURIComponent(here)}`}>Sign in with an API token</a>.
    </div>
  );
}

function Shell() {
  const route = useRoute();
  const [page, arg] = route.path;
  // a run's share link (lib/share.ts): that run's page alone, read-only, for someone who may have no account
  const shared = page === "runs" && Boolean(arg) && Boolean(route.query.get(SHARE_PARAM));
  let body;
  if (page === "signin") body = <SignIn query={route.query} />;
  else if (page === "runs" && arg && /^\d+$/.test(arg)) body = <RunPage key={arg} id={Number(arg)} />;
  else if (page === "runs") body = <Runs />;
  else if (page === "calibration") body = <CalibrationPage />;
  else if (page === "workers") body = <WorkersPage />;
  else if (page === "plans") body = <Plans />;
  else if (page === "compare") {
    const ids = (route.query.get("ids") ?? "").split(",").map(Number).filter((n) => Number.isInteger(n) && n > 0);
    body = <Compare ids={ids} />;
  } else body = <Planner key={route.query.get("plan") ?? ""} query={route.query} />;
  const active = ["runs", "compare", "signin", "calibration", "plans", "workers"].includes(page ?? "") ? page : "planner";
  return (
    <div className="app">
      <header className="topbar">
        <a className="brand" href={shared ? undefined : "#/planner"}>Ulysses Lab</a>
        {shared ? <span className="muted" data-testid="shared-banner">a run shared with you, view only</span> : (<>
          <nav>
            <a href="#/planner" className={active === "planner" ? "active" : ""} data-testid="nav-planner">Planner</a>
            <a href="#/plans" className={active === "plans" ? "active" : ""} data-testid="nav-plans">Plans</a>
            <a href="#/runs" className={active === "runs" ? "active" : ""} data-testid="nav-runs">Runs</a>
            <a href="#/compare" className={active === "compare" ? "active" : ""} data-testid="nav-compare">Compare</a>
            <a href="#/calibration" className={active === "calibration" ? "active" : ""} data-testid="nav-calibration">Calibration</a>
            <a href="#/workers" className={active === "workers" ? "active" : ""} data-testid="nav-workers">Workers</a>
          </nav>
          <Who />
        </>)}
      </header>
      <main>
        <SignInBanner page={page ?? ""} shared={shared} />
        {body}
      </main>
    </div>
  );
}

export function App() {
  return (
    <AuthProvider>
      <Shell />
    </AuthProvider>
  );
}

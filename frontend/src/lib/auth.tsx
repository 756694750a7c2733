import { useQuery } from "@tanstack/react-query";
import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from "react";
import { client, UNAUTHORIZED_EVENT, unwrap, type Identity, type Role, type Run } from "./api";

type Auth = {
  /** undefined while asking the API, null when not signed in */
  identity: Identity | null | undefined;
  refresh: () => Promise<void>;
  /** true after an API call answered 401 */
  unauthorized: boolean;
};

const AuthContext = createContext<Auth>({ identity: undefined, refresh: async () => undefined, unauthorized: false });

// What each role may do (mirrors backend/auth/roles.py).
const GRANTS: Record<Role, string[]> = {
  viewer: ["read"],
  submitter: ["read", "submit"],
  approver: ["read", "submit", "approve", "cancel_any"],
  admin: ["read", "submit", "approve", "cancel_any", "admin"],
  worker: ["read", "ingest"],
};

export function can(identity: Identity | null | undefined, permission: string): boolean {
  return Boolean(identity && GRANTS[identity.role]?.includes(permission));
}

/** Approvers cancel any run; submitters only the runs they submitted. */
export function canCancel(identity: Identity | null | undefined, run: Run): boolean {
  if (can(identity, "cancel_any")) return true;
  return can(identity, "submit") && identity?.token_id != null && run.submitted_by === identity.token_id;
}

export function AuthProvider({ children }: { children: ReactNode }) {
  const session = useQuery({ queryKey: ["session"], queryFn: () => unwrap(client.GET("/api/session")) });
  const [unauthorized, setUnauthorized] = useState(false);
  const { refetch } = session;
  const refresh = useCallback(async () => {
    const r = await refetch();
    if (r.isSuccess) setUnauthorized(false);
  }, [refetch]);
  useEffect(() => {
    const on401 = () => setUnauthorized(true);
    window.addEventListener(UNAUTHORIZED_EVENT, on401);
    return () => window.removeEventListener(UNAUTHORIZED_EVENT, on401);
  }, []);
  // a failed read (401: not signed in) means no identity, even where an earlier read had one
  const identity = session.isPending ? undefined : session.isError ? null : session.data;
  // one value while nothing changes: every run row's actions read it, and a new object would re-render them all
  const value = useMemo(() => ({ identity, refresh, unauthorized }), [identity, refresh, unauthorized]);
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export const useAuth = () => useContext(AuthContext);

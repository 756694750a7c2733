import { createContext, useCallback, useContext, useEffect, useState, type ReactNode } from "react";
import { api, UNAUTHORIZED_EVENT, type Identity, type Role, type Run } from "./api";

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
  const [identity, setIdentity] = useState<Identity | null | undefined>(undefined);
  const [unauthorized, setUnauthorized] = useState(false);
  const refresh = useCallback(async () => {
    try {
      setIdentity(await api.whoami());
      setUnauthorized(false);
    } catch {
      setIdentity(null);
    }
  }, []);
  useEffect(() => {
    refresh();
    const on401 = () => setUnauthorized(true);
    window.addEventListener(UNAUTHORIZED_EVENT, on401);
    return () => window.removeEventListener(UNAUTHORIZED_EVENT, on401);
  }, [refresh]);
  return <AuthContext.Provider value={{ identity, refresh, unauthorized }}>{children}</AuthContext.Provider>;
}

export const useAuth = () => useContext(AuthContext);

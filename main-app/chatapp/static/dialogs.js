// The page's dialogs: opened next to what opened them, focus given back when they close.
import { input } from "./page.js";

export function showDialog(dialog, opener) {
  dialog.returnFocusTo = opener;
  dialog.showModal();
}

export function closeDialog(dialog) {
  dialog.close();
}

for (const dialog of document.querySelectorAll("dialog")) {
  // The close event comes a moment after close(): by then the focus may have moved on.
  dialog.addEventListener("close", () => {
    const focused = document.activeElement;
    if (focused && focused !== document.body && !dialog.contains(focused)) return;
    const target = dialog.returnFocusTo;
    if (target?.isConnected && !target.disabled) target.focus();
    else input.focus();
  });
}

"""algorithms/fedbnr"""

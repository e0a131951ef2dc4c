"""algorithms/pofmkl"""
